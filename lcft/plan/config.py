"""`PlanConfig`: every `lcft train` option plus the machines a plan is made for (GPU memory, GPUs and host memory
per node)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from lcft.config import ConfigError, at_least_one, at_most, check_choice
from lcft.parallel.config import MAX_PROCESSES
from lcft.train.config import TrainConfig

PlanDevice = Literal["cuda", "cpu"]  # what a plan is made for (the runtime terms differ)

# A number, then K/M/G/T alone or with iB (powers of 1024) or with B (powers of 1000); or a number of bytes (with
# B or without). Nothing else: a lowercase b (bits), an iB without a multiple, is refused.
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kKmMgGtT])(iB|B)?|B?)\s*$")
# A multiple with its B or iB in another case ('80gb', '80GIB'): refused, naming the two sizes it may mean.
_OTHER_CASE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt])(i?b)\s*$", re.IGNORECASE)
MIN_MEMORY = 1 << 30  # 1 GiB: no GPU or node is smaller; a size under it is a multiple left out ('80' is 80 bytes)
MAX_MEMORY = 1 << 60  # 1 EiB, of one GPU or one node: far above any machine, and a float holds every figure below it


def parse_bytes(text: str, name: str = "gpu_memory") -> int:
    """'80GiB' / '80G' -> 80 x 2^30, '80GB' -> 80 x 10^9, '512MiB' -> 512 x 2^20, '4096' -> 4096 bytes (`name`:
    the option, for errors). Exact: whole bytes, at least MIN_MEMORY, at most MAX_MEMORY."""
    m = _BYTES.match(str(text))
    if not m:
        if other := _OTHER_CASE.match(str(text)):  # B is bytes, b bits; iB is binary: the two sizes it may mean
            number, power = other.group(1), " KMGT".index(other.group(2).upper())
            raise ConfigError(f"{name}: not a memory size: {text!r}; write {number}{other.group(2).upper()}B for "
                              f"{number} x 10^{3 * power} bytes or {number}{other.group(2).upper()}iB for "
                              f"{number} x 2^{10 * power} bytes")
        raise ConfigError(f"{name}: not a memory size: {text!r} (use e.g. 80GiB, 141GB, 24G, or a number of bytes)")
    unit = (m.group(2) or "").upper()
    base = 1000 if m.group(3) == "B" else 1024
    try:  # a Fraction: a float would overflow to infinity on a long number
        out = int(Fraction(m.group(1)) * base ** " KMGT".index(unit or " "))
    except ValueError:  # more digits than Python converts
        raise ConfigError(f"{name}: not a memory size: {text!r} (too many digits)") from None
    if out < MIN_MEMORY:
        number = m.group(1)
        if not unit and Fraction(number) >= 1:  # a bare number is bytes: most likely a multiple left out
            raise ConfigError(f"{name}: {str(text).strip()!r} is {number} bytes, under 1 GiB: did you mean {number}GiB or "
                              f"{number}GB?")
        raise ConfigError(f"{name}: {str(text).strip()!r} is under 1 GiB, less than any GPU or node has (e.g. 80GiB, "
                          "141GB, 24G)")
    if out > MAX_MEMORY:
        raise ConfigError(f"{name} {text!r} is above lcft's limit of 1 EiB (2^60 bytes)")
    return out


DEFAULT_GPU_MEMORY = "80GiB"  # a CUDA plan's GPU when --gpu-memory is not given (an A100's or H100's)
PLANNED_ENDPOINT = "node0:29500"
"""The rendezvous a plan of several nodes stands in when none is given (rdzv_endpoint's docstring below says why)."""


@dataclass
class PlanConfig(TrainConfig):
    """`lcft train`'s options (the layout to plan: --nproc/--nnodes or --gpus-per-node, --cp, --cp-kv,
    --shard, --offload-params, --checkpointing, --offload-activations, --offload-bf16, --micro-batch, --seq-len,
    --preset or --init) and the GPUs to plan for. Nothing is read but the model's config.json."""

    gpu_memory: str | None = None
    """Memory of one GPU: 80GiB (or 80G) = 80 x 2^30 bytes, 141GB = 141 x 10^9 bytes (K, M, G, T; a bare number
    is bytes; at least 1 GiB; default: 80GiB). CUDA plans only."""
    gpus_per_node: int | None = None
    """GPUs (one process each) per node; the world is nnodes x this (default: --nproc)."""
    host_memory: str | None = None
    """Host (CPU) memory of one node, e.g. 128GiB: what its ranks offload (or the fp32 model each reads at start,
    when larger), plus each process's own (an assumed constant; --explain names it), must fit in it too; on CPU
    what its ranks hold, all of it (default: not checked)."""
    device: PlanDevice = "cuda"
    """Plan for CUDA GPUs, or for CPU processes (the runtime term differs; --precision auto as `lcft train` picks it
    on this machine: bf16 on a CPU with native bf16, else fp32)."""
    explain: bool = False
    """Print where each figure comes from: the formula, or the measured or assumed constant."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the run's rendezvous on node 0, as `lcft train` takes it: a plan starts no node, so it only
    checks its form; not needed, also with --nnodes > 1 (a plan only counts the ranks)."""

    def __post_init__(self) -> None:
        if type(self.nnodes) is int and self.nnodes > 1 and self.rdzv_endpoint is None:  # a plan starts no node: no rendezvous to name
            self.rdzv_endpoint = PLANNED_ENDPOINT
        TrainConfig.__post_init__(self)
        check_choice(self.device, PlanDevice, "device")  # the sections checked theirs
        if self.gpu_memory is not None:
            if self.device == "cpu":
                raise ConfigError("gpu_memory is for CUDA plans: a CPU plan's ranks hold the host's memory (give one "
                                  "node's as --host-memory)")
            parse_bytes(self.gpu_memory)
        if self.host_memory is not None:
            parse_bytes(self.host_memory, "host_memory")
        at_least_one(self, "gpus_per_node")
        at_most(self, MAX_PROCESSES, "lcft's limit of processes per node", "gpus_per_node")

    @property
    def gpu_bytes(self) -> int | None:
        """One GPU's memory (--gpu-memory, default DEFAULT_GPU_MEMORY); None on CPU, where there is none."""
        return None if self.device == "cpu" else parse_bytes(self.gpu_memory or DEFAULT_GPU_MEMORY)

    @property
    def host_bytes(self) -> int | None:
        return None if self.host_memory is None else parse_bytes(self.host_memory, "host_memory")

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node or self.nproc

    @property
    def world(self) -> int:
        return self.nnodes * self.ranks_per_node

