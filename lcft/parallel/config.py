"""How a run is spread: `CpConfig` (how one window is split across ranks), `LaunchConfig` (how many processes on
how many nodes), and `ParallelConfig`, the two together, which EvalConfig extends.

TrainConfig takes CpConfig (in its parallel section) and LaunchConfig (its launch section) and EvalConfig
ParallelConfig, so `--nproc`, `--cp`, `--cp-layout`, `--cp-kv` and the launch options (`--nnodes`, `--node-rank`,
`--rdzv-endpoint`, `--max-restarts`, `--collective-timeout`, `--stop-grace`), with their flat TOML keys, are declared and
documented once, here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from lcft.config import ConfigError, at_most, check_choices

CpLayout = Literal["zigzag", "contiguous"]
CpKv = Literal["all", "selected", "stream"]
Shard = Literal["none", "fsdp"]  # how ranks hold the weights: whole (DDP) or sharded (FSDP2)
Checkpointing = Literal["none", "block"]  # activation checkpointing (lcft.parallel.activations)
Precision = Literal["fp32", "bf16"]  # compute precision (weights stay fp32)
PrecisionChoice = Literal["auto", Precision]  # what a user may ask for: auto picks by device (lcft.train.precision)
# seconds one collective, or the stop grace, may wait: torch takes them as a timedelta (at most 10^9 days) and a
# threading timeout, and a run that should wait longer than a month for a rank has stopped
MAX_COLLECTIVE_TIMEOUT = 30 * 86400
MAX_PROCESSES = 1 << 20  # processes per node, or nodes: far above any cluster, and a plan's figures stay finite


def shards_parameters(fsdp: bool, world: int) -> bool:
    """Whether --shard fsdp (`fsdp`) shards anything on `world` processes: one process holds the whole model."""
    return fsdp and world > 1


@dataclass
class CpConfig:
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

    def __post_init__(self) -> None:
        if int(self.cp) < 1:
            raise ConfigError(f"cp must be at least 1, got {self.cp}")
        check_choices(self)  # every Literal field of this config and of those extending it, checked once

    def idle_split(self) -> list[str]:
        """A warning when the window split's options (--cp-kv, --cp-layout other than their defaults) are given
        without cp, where they change nothing (a shared config, or flags meant for a launch of several)."""
        given = [f"--{name.replace('_', '-')} {getattr(self, name)}" for name in SPLIT_OPTIONS
                 if getattr(self, name) != getattr(CpConfig, name)]
        if not given or self.cp > 1:
            return []
        return [f"warning: {' and '.join(given)} {'has' if len(given) == 1 else 'have'} no effect with cp 1: no "
                "window is split across ranks (--cp N splits each over N)"]


SPLIT_OPTIONS = ("cp_kv", "cp_layout")  # how a window is split over cp ranks: nothing is split with cp 1


@dataclass
class LaunchConfig:
    """How many processes a run starts, on how many nodes, and how long they wait for each other."""

    nproc: int = 1
    """Processes to start on this node (torchrun; gloo on CPU); the world size is nnodes x nproc and
    dp = world size / cp. Under an existing torchrun launch it is ignored."""

    nnodes: int = 1
    """Nodes of the run: start `lcft train|eval` once on every node with the same options, each with its own
    --node-rank, and --rdzv-endpoint pointing at node 0 (the nodes check that they agree when they meet: a node
    that differs is one line on every node)."""

    node_rank: int = 0
    """This node's number, 0 to nnodes - 1 (node 0 hosts the rendezvous; error messages name nodes by it)."""

    rdzv_endpoint: str | None = None
    """HOST:PORT of the rendezvous on node 0 (c10d, hosted by node 0's launcher); needed with --nnodes > 1."""

    max_restarts: int = 0
    """Elastic restarts: when a process dies, restart the whole group up to this many times; restarted
    processes continue by themselves (train from the latest verified checkpoint, as --resume auto; eval from the
    losses kept in its --out)."""

    collective_timeout: float = 600.0
    """Seconds a process waits for the others in one collective (all-reduce, barrier, ...) before the run
    ends, naming the ranks and nodes that stopped answering (exit code 75); also how long a node waits at the
    rendezvous for the others (whole seconds, rounded up)."""

    stop_grace: int = 300
    """Seconds torchrun's agent, once it got a stop signal (a scheduler's SIGTERM reaches every process of the
    job), gives its workers to finish the step and save before it kills them (SIGKILL); also how long it waits for
    them to end when a run ends. Match it to the time the scheduler leaves between its SIGTERM and its SIGKILL
    (SLURM --signal=TERM@S: S)."""

    def __post_init__(self) -> None:
        for name in ("nproc", "nnodes"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        at_most(self, MAX_PROCESSES, "lcft's limit of processes or nodes", "nproc", "nnodes")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank must be within [0, nnodes - 1] = [0, {self.nnodes - 1}], "
                              f"got {self.node_rank}")
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must not be negative, got {self.max_restarts}")
        if not (math.isfinite(self.collective_timeout) and 0 < self.collective_timeout <= MAX_COLLECTIVE_TIMEOUT):
            raise ConfigError(f"collective_timeout must be a positive number of seconds, at most "
                              f"{MAX_COLLECTIVE_TIMEOUT:,} (30 days), got {self.collective_timeout}")
        if not 0 < self.stop_grace <= MAX_COLLECTIVE_TIMEOUT:  # (torch waits in a threading timeout: bounded)
            raise ConfigError(f"stop_grace must be a positive number of seconds, at most {MAX_COLLECTIVE_TIMEOUT:,} "
                              f"(30 days), got {self.stop_grace}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("rdzv_endpoint: give node 0's HOST:PORT (--rdzv-endpoint) for a run on several nodes")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            host = host[1:-1] if host[:1] == "[" and host[-1:] == "]" else host  # [IPv6]:PORT
            # torch's parse_rendezvous_endpoint takes a host of these characters only (a traceback in every
            # worker otherwise)
            if not (re.fullmatch(r"[\w.:-]+", host) and re.fullmatch(r"[0-9]{1,5}", port) and 0 < int(port) < 65536):
                raise ConfigError(f"rdzv_endpoint must be HOST:PORT (a host name, IPv4 or [IPv6] address), got "
                                  f"{self.rdzv_endpoint!r}")

    @property
    def multiprocess(self) -> bool:
        """True when the launcher (torchrun) starts the processes: several of them, or elastic restarts."""
        return self.nproc > 1 or self.nnodes > 1 or self.max_restarts > 0


@dataclass
class ParallelConfig(CpConfig, LaunchConfig):
    """The window split and the launch together: what `lcft eval` takes (lcft train takes them as two sections)."""

    def __post_init__(self) -> None:
        CpConfig.__post_init__(self)
        LaunchConfig.__post_init__(self)
