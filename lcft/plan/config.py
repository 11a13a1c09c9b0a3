"""`PlanConfig`: every `lcft train` option plus the GPUs a plan is made for (memory per GPU, GPUs per node)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from lcft.config import ConfigError, check_choice
from lcft.train.config import TrainConfig

PlanDevice = Literal["cuda", "cpu"]  # what a plan is made for (the runtime terms differ)

_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)[bB]?\s*$")


def parse_bytes(text: str) -> int:
    """'80GiB' / '80G' -> 80 x 2^30, '80GB' -> 80 x 10^9, '512MiB' -> 512 x 2^20."""
    m = _BYTES.match(str(text))
    if not m:
        raise ConfigError(f"gpu_memory: not a memory size: {text!r} (use e.g. 80GiB, 141GB, 24G)")
    num, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = " KMGT".index(unit) if unit else 0
    decimal = bool(unit) and not binary and str(text).strip().upper().endswith("B")
    out = num * (1000 ** power if decimal else 1024 ** power)
    if out <= 0:
        raise ConfigError(f"gpu_memory must be positive, got {text!r}")
    return int(out)


@dataclass
class PlanConfig(TrainConfig):
    """`lcft train`'s options (the layout to plan: --nproc/--nnodes or --gpus-per-node, --cp, --cp-kv,
    --shard, --offload-params, --checkpointing, --offload-activations, --micro-batch, --seq-len, --preset or
    --init) and the GPUs to plan for. Nothing is read but the model's config.json."""

    gpu_memory: str = "80GiB"
    """Memory of one GPU: 80GiB (or 80G) = 80 x 2^30 bytes, 141GB = 141 x 10^9 bytes."""
    gpus_per_node: int | None = None
    """GPUs (one process each) per node; the world is nnodes x this (default: --nproc)."""
    device: PlanDevice = "cuda"
    """Plan for CUDA GPUs, or for CPU processes (the runtime term differs; fp32 unless --precision bf16)."""
    explain: bool = False
    """Print where each figure comes from: the formula, or the measured or assumed constant."""

    def __post_init__(self) -> None:
        TrainConfig.__post_init__(self)
        check_choice(self.device, PlanDevice, "device")  # the sections checked theirs
        parse_bytes(self.gpu_memory)
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ConfigError(f"gpus_per_node must be at least 1 (got {self.gpus_per_node})")

    @property
    def gpu_bytes(self) -> int:
        return parse_bytes(self.gpu_memory)

    @property
    def world(self) -> int:
        return self.nnodes * (self.gpus_per_node or self.nproc)

