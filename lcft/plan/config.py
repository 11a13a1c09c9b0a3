"""`PlanConfig`: every `lcft train` option plus the machines a plan is made for (GPU memory, GPUs and host memory
per node)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from lcft.config import ConfigError, check_choice
from lcft.train.config import TrainConfig

PlanDevice = Literal["cuda", "cpu"]  # what a plan is made for (the runtime terms differ)

_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)[bB]?\s*$")


def parse_bytes(text: str, name: str = "gpu_memory") -> int:
    """'80GiB' / '80G' -> 80 x 2^30, '80GB' -> 80 x 10^9, '512MiB' -> 512 x 2^20 (`name`: the option, for errors)."""
    m = _BYTES.match(str(text))
    if not m:
        raise ConfigError(f"{name}: not a memory size: {text!r} (use e.g. 80GiB, 141GB, 24G)")
    num, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = " KMGT".index(unit) if unit else 0
    decimal = bool(unit) and not binary and str(text).strip().upper().endswith("B")
    out = num * (1000 ** power if decimal else 1024 ** power)
    if out <= 0:
        raise ConfigError(f"{name} must be positive, got {text!r}")
    return int(out)


@dataclass
class PlanConfig(TrainConfig):
    """`lcft train`'s options (the layout to plan: --nproc/--nnodes or --gpus-per-node, --cp, --cp-kv,
    --shard, --offload-params, --checkpointing, --offload-activations, --offload-bf16, --micro-batch, --seq-len,
    --preset or --init) and the GPUs to plan for. Nothing is read but the model's config.json."""

    gpu_memory: str = "80GiB"
    """Memory of one GPU: 80GiB (or 80G) = 80 x 2^30 bytes, 141GB = 141 x 10^9 bytes."""
    gpus_per_node: int | None = None
    """GPUs (one process each) per node; the world is nnodes x this (default: --nproc)."""
    host_memory: str | None = None
    """Host (CPU) memory of one node, e.g. 128GiB: what its ranks offload (or the fp32 model each reads at start,
    when larger), plus each process's own (an assumed constant; --explain names it), must fit in it too (default:
    not checked). CUDA plans only."""
    device: PlanDevice = "cuda"
    """Plan for CUDA GPUs, or for CPU processes (the runtime term differs; fp32 unless --precision bf16)."""
    explain: bool = False
    """Print where each figure comes from: the formula, or the measured or assumed constant."""

    def __post_init__(self) -> None:
        TrainConfig.__post_init__(self)
        check_choice(self.device, PlanDevice, "device")  # the sections checked theirs
        parse_bytes(self.gpu_memory)
        if self.host_memory is not None:
            if self.device == "cpu":
                raise ConfigError("host_memory is for CUDA plans: on CPU the ranks' memory is the host's "
                                  "(give it as --gpu-memory, per rank)")
            parse_bytes(self.host_memory, "host_memory")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ConfigError(f"gpus_per_node must be at least 1 (got {self.gpus_per_node})")

    @property
    def gpu_bytes(self) -> int:
        return parse_bytes(self.gpu_memory)

    @property
    def host_bytes(self) -> int | None:
        return None if self.host_memory is None else parse_bytes(self.host_memory, "host_memory")

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node or self.nproc

    @property
    def world(self) -> int:
        return self.nnodes * self.ranks_per_node

