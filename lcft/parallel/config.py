"""ParallelConfig: how many processes a run starts and how one window is split across ranks (context parallelism).

TrainConfig and EvalConfig extend it, so `--nproc`, `--cp`, `--cp-layout` and `--cp-kv` (and the flat TOML keys
nproc, cp, cp_layout, cp_kv) are declared and documented once, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lcft.config import ConfigError

CpLayout = Literal["zigzag", "contiguous"]
CpKv = Literal["all", "selected", "stream"]
CP_KV_MODES = ("all", "selected", "stream")


@dataclass
class ParallelConfig:
    """Context parallelism: cp ranks share one window; data parallelism dp = world size / cp."""

    cp: int = 1
    """Context-parallel ranks per window (1 = off): they split every window (the cp ranks of one data-parallel
    group are consecutive). The world size must be a multiple of it; dp = world size / cp."""

    cp_layout: CpLayout = "zigzag"
    """How tokens are split across cp ranks: 'zigzag' cuts the window into 2*cp chunks and rank r holds
    chunks r and 2*cp-1-r (balanced causal work); 'contiguous' gives rank r chunks 2r and 2r+1."""

    cp_kv: CpKv = "all"
    """How keys/values reach the ranks that attend to them: 'all' all-gathers every rank's K/V each layer;
    'selected' sends only the K/V blocks a rank's selection needs (all_to_all), fewer bytes for sparse
    attention; 'stream' sends the other ranks' K/V a piece at a time and merges partial attention by
    log-sum-exp, so no rank holds the whole window's K/V (least memory, more bytes: pieces travel again in
    backward)."""

    nproc: int = 1
    """Local processes to start (torchrun; gloo on CPU); dp = nproc / cp. Under an existing torchrun launch it
    is ignored."""

    def __post_init__(self) -> None:
        for name in ("cp", "nproc"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.cp_layout not in ("zigzag", "contiguous"):
            raise ConfigError(f"cp_layout must be 'zigzag' or 'contiguous', got {self.cp_layout!r}")
        if self.cp_kv not in CP_KV_MODES:
            raise ConfigError(f"cp_kv must be one of {', '.join(CP_KV_MODES)}; got {self.cp_kv!r}")
