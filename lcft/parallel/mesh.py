"""The dp x cp process layout: which ranks share a window (cp group) and which hold the same tokens (dp group)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from lcft.launch import liveness
from lcft.parallel.config import ParallelConfig
from lcft.shapes import check_world


@dataclass(frozen=True)
class ParallelState:
    """Where this process sits in the dp x cp mesh (rank = dp_rank * cp + cp_rank) and its process groups."""

    world: int
    """Total number of processes."""
    rank: int
    """Global rank of this process."""
    cp: int
    """Context-parallel degree (ranks per window)."""
    dp: int
    """Data-parallel degree (windows processed at once) = world // cp."""
    cp_rank: int
    """Position of this rank inside its cp group: which shard of the window it holds."""
    dp_rank: int
    """Index of this rank's data-parallel replica: which window it reads."""
    cp_group: dist.ProcessGroup | None = None
    """Process group of the cp ranks sharing this rank's window (None when cp == 1)."""
    dp_group: dist.ProcessGroup | None = None
    """Process group of the ranks with the same cp_rank across replicas (None when dp == 1)."""

    @property
    def cp_enabled(self) -> bool:
        """True when a window is split across more than one rank."""
        return self.cp > 1

    @property
    def cp_ranks(self) -> list[int]:
        """Global ranks of this rank's cp group, in cp_rank order."""
        return [self.dp_rank * self.cp + r for r in range(self.cp)]


def single_process_state() -> ParallelState:
    """The layout of a plain one-process run (no groups, no collectives)."""
    return ParallelState(world=1, rank=0, cp=1, dp=1, cp_rank=0, dp_rank=0)


def init_world(collective_timeout: float) -> bool:
    """Join the process group a torchrun launch describes (env://: RANK, WORLD_SIZE, MASTER_ADDR), with
    `collective_timeout` seconds per collective, and start this rank's heartbeat; True when there is a group
    (several processes). A group someone else initialised is kept as it is (its own timeout)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not dist.is_initialized():
        if world <= 1:
            return False
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=collective_timeout))
    liveness.start(dist.get_rank(), dist.get_world_size(), collective_timeout)
    return True


def init_parallel(cfg: ParallelConfig) -> ParallelState:
    """Build the dp x cp layout on top of the default process group (already initialised by the launcher,
    Accelerate or `torch.distributed.init_process_group`). Every rank must call it, in the same order,
    because `new_group` is collective. Raises before any collective if the world does not split."""
    if not (dist.is_available() and dist.is_initialized()):
        check_world(1, cfg.cp)
        return single_process_state()
    world, rank = dist.get_world_size(), dist.get_rank()
    dp = check_world(world, cfg.cp)
    cp_rank, dp_rank = rank % cfg.cp, rank // cfg.cp
    cp_group = dp_group = None
    # new_group is collective over the whole world: every rank creates every group, keeping its own.
    for d in range(dp):
        ranks = [d * cfg.cp + r for r in range(cfg.cp)]
        group = dist.new_group(ranks) if cfg.cp > 1 else None
        if d == dp_rank:
            cp_group = group
    for c in range(cfg.cp):
        ranks = [d * cfg.cp + c for d in range(dp)]
        group = dist.new_group(ranks) if dp > 1 else None
        if c == cp_rank:
            dp_group = group
    return ParallelState(
        world=world, rank=rank, cp=cfg.cp, dp=dp, cp_rank=cp_rank, dp_rank=dp_rank,
        cp_group=cp_group, dp_group=dp_group,
    )
