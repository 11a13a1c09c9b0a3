"""The dp x cp layout of a run: one DeviceMesh ("dp", "cp") whose cp groups split a window and whose flattened
dp x cp dimension FSDP shards over."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lcft import liveness
from lcft.errors import LcftError, printable, reason
from lcft.parallel.config import CpConfig, shards_parameters
from lcft.parallel.same_run import check_same_run
from lcft.shapes import check_world

MESH_DIMS = ("dp", "cp")
"""Names of the mesh's dimensions, outer to inner: ranks dp_rank * cp + cp_rank."""
SHARD_DIM = "dp_cp"
"""The flattened dp x cp dimension FSDP shards parameters over (every rank holds one part)."""


@dataclass(frozen=True)
class ParallelState:
    """The layout of a run: where this process sits in the dp x cp grid (rank = dp_rank * cp + cp_rank), the one
    DeviceMesh ("dp", "cp") its context-parallel group and FSDP both come from, and whether parameters are
    sharded over it. Built once per run (init_parallel); every component reads its degrees and ranks here."""

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
    """The mesh's "cp" group: the ranks sharing this rank's window (None when cp == 1)."""
    mesh: DeviceMesh | None = None
    """The ("dp", "cp") mesh of every rank (None in a single process)."""
    fsdp: bool = False
    """Parameters, gradients and optimizer state sharded over the flattened mesh (--shard fsdp)."""
    shard: DeviceMesh | None = None
    """The mesh's flattened dp x cp dimension, as flattening it returned (None unless parameters are sharded)."""

    @property
    def cp_enabled(self) -> bool:
        """True when a window is split across more than one rank."""
        return self.cp > 1

    @property
    def fsdp_enabled(self) -> bool:
        """True when parameters are sharded: --shard fsdp with more than one process (one holds everything)."""
        return self.mesh is not None and shards_parameters(self.fsdp, self.world)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the run's shared files and talks to the user."""
        return self.rank == 0

    def shard_mesh(self) -> DeviceMesh:
        """The 1-D flattened dp x cp view of the mesh that FSDP shards over (made by init_parallel)."""
        if not self.fsdp_enabled or self.shard is None:
            raise ValueError("shard_mesh: this layout does not shard parameters")
        return self.shard


def single_process_state() -> ParallelState:
    """The layout of a plain one-process run (no groups, no collectives)."""
    return ParallelState(world=1, rank=0, cp=1, dp=1, cp_rank=0, dp_rank=0)


def group_backend() -> str:
    """NCCL for CUDA tensors with gloo beside it for CPU ones (the step's token counts and timings, the norm of
    gradients offloaded to the CPU): a group of NCCL alone refuses every CPU tensor. gloo alone without CUDA."""
    return "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"


def mesh_device_type() -> str:
    """The device type of the default group's mesh: cuda when it has NCCL (alone or beside gloo)."""
    return "cuda" if "nccl" in str(dist.get_backend()) else "cpu"


def init_world(collective_timeout: float, same_run: Callable[[], dict[str, str]] | None = None) -> bool:
    """Join the process group a torchrun launch describes (env://: RANK, WORLD_SIZE, MASTER_ADDR), waiting at most
    `collective_timeout` seconds for the other processes and then as much per collective, and start this rank's
    heartbeat; then, before the run's first collective, check that every rank runs the same run: `same_run()` is
    this rank's fingerprint (lcft.parallel.same_run; a node given other options, data or software is one line on
    every rank, not a silent or hung run). True when there is a group (several processes). A group someone else
    initialised is kept as it is (its own timeout)."""
    world = liveness.launch_world()
    if not dist.is_initialized():
        if world <= 1:
            return False
        _join(world, collective_timeout)
    liveness.start(dist.get_rank(), dist.get_world_size(), collective_timeout, _group_restarts())
    if same_run is not None and dist.get_world_size() > 1:
        check_same_run(same_run())
    return True


def _group_restarts() -> int:
    """How many times the elastic agent restarted this group, the same on every rank: the highest of the ranks'
    own counts. After one node's worker failed, its agent counts the restart, while another node's agent may
    restart its workers for the membership change first (its count stays), so that one group holds both."""
    count = torch.tensor([liveness.own_restarts()], dtype=torch.int64, device=liveness.scalar_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _join(world: int, timeout_s: float) -> None:
    """init_process_group over env:// (the agent's store under lcft's launch, a prefix per group: _round_store), whose
    store waits `timeout_s` for the other processes to connect."""
    _check_agent_store()
    try:
        dist.init_process_group(group_backend(), timeout=timedelta(seconds=timeout_s), **_round_store(world, timeout_s))
    except dist.DistError as e:  # the others never came, or the address is not this launch's (in use, unreachable)
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise LcftError(f"no process group of {world} processes formed at MASTER_ADDR:MASTER_PORT {where} within "
                        f"--collective-timeout {timeout_s:g} s ({reason(e, 160)}): did every process start? (variables "
                        f"left in the shell from another job: unset {' '.join(liveness.PROCESS_ENV)} "
                        f"{liveness.LAUNCHER_ENV})") from None


def _round_store(world: int, timeout_s: float) -> dict[str, Any]:
    """init_process_group's store, rank and world size when the elastic agent shares its store with the workers
    (lcft's --nproc): the agent's, under a prefix of this group. torchrun's agent keeps that store across the
    restarts of its group (lcft's makes a new one for each), and torch's env:// gives the workers no prefix of
    their own: a restarted rank could read the addresses the dead group published (gloo: "connectFullMesh failed
    ... Connection refused"). The prefix is the rendezvous round lcft's agent hands its workers (liveness.ROUND_ENV:
    one per group, the same on every node), else on one node its count of restarts; across nodes the agents count
    restarts apart (liveness.RESTART_ENV): {} there, and env:// as torch makes it."""
    group = liveness.handed_round()
    if group is None and os.environ.get("LOCAL_WORLD_SIZE") == str(world):
        group = liveness.own_restarts()
    if not liveness.agent_store() or group is None:
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    return {"store": dist.PrefixStore(f"lcft/round/{group}", store), "rank": int(os.environ["RANK"]),
            "world_size": world}


def _check_agent_store() -> None:
    """An elastic agent that shares its store with its workers (TORCHELASTIC_USE_AGENT_STORE) listens at
    MASTER_ADDR:MASTER_PORT before it starts them: a refused connection means no agent is there (its workers'
    environment copied into a shell), which torch's store would retry, logging each try, for the whole timeout."""
    if not liveness.agent_store():
        return  # rank 0 hosts the store itself: the others may reach for it first
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        raise LcftError(f"nothing listens at MASTER_ADDR:MASTER_PORT {host}:{port}, where the elastic agents of the "
                        f"launch that started this process ({liveness.LAUNCHER_ENV}="
                        f"{printable(os.environ[liveness.LAUNCHER_ENV])}) keep their store: unset "
                        f"{' '.join(liveness.PROCESS_ENV)} {liveness.LAUNCHER_ENV} (left from another job?) to run as "
                        f"one process, or {liveness.START_SEVERAL}") from None
    except (OSError, ValueError):  # unreachable, slow, a port that is no number: the store's own timeout decides
        pass


def init_parallel(cfg: CpConfig, fsdp: bool = False) -> ParallelState:
    """Build the run's layout on top of the default process group (already initialised by the launcher,
    Accelerate or `torch.distributed.init_process_group`): one DeviceMesh ("dp", "cp") over every rank, and
    with `fsdp` its flattened dp x cp dimension. Every rank must call it, in the same order (making the mesh's
    groups is collective). Raises before any collective if the world does not split."""
    if not (dist.is_available() and dist.is_initialized()):
        check_world(1, cfg.cp)
        return dataclasses.replace(single_process_state(), fsdp=fsdp)
    world, rank = dist.get_world_size(), dist.get_rank()
    dp = check_world(world, cfg.cp)
    mesh = init_device_mesh(mesh_device_type(), (dp, cfg.cp), mesh_dim_names=MESH_DIMS)
    # torchtitan's dp_shard x cp: the cp ranks of a window hold the same weights. The flattened mesh is kept as
    # made: slicing it back out of the root mesh (mesh[SHARD_DIM]) is deprecated from torch 2.11 on, and warned.
    shard = mesh._flatten(SHARD_DIM) if shards_parameters(fsdp, world) else None
    return ParallelState(
        world=world, rank=rank, cp=cfg.cp, dp=dp, cp_rank=rank % cfg.cp, dp_rank=rank // cfg.cp,
        cp_group=mesh.get_group("cp") if cfg.cp > 1 else None, mesh=mesh, fsdp=fsdp, shard=shard,
    )
