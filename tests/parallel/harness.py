"""Run a function on N gloo processes spawned from inside pytest and collect each rank's return value."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A port free now, not held: another process may take it before it is bound. For what joins over env:// as
    a launch does (the product's own port handling), never for a world this harness makes (`run_ranks`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world: int, out_dir: str, port: int | None, args: tuple) -> None:
    """One rank: the group initialised over a FileStore in `out_dir` (`port` None), else env://'s variables set
    for fn to join at 127.0.0.1:`port` itself."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)  # N processes share the machine's few cores
    if port is None:  # a store in this world's own folder: no port that another world started at once could take
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'store')}", rank=rank,
                                world_size=world)
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # The result is saved: the process ends here, without the interpreter's teardown, in which a two-process FSDP
    # run's process sometimes aborted in C++ after passing ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable, world: int, *args: Any, init: bool = True, timeout: float = 150.0) -> list[Any]:
    """fn(rank, world, *args) on `world` spawned processes (gloo initialised first, over a FileStore, unless
    init=False: fn then joins over env://, MASTER_ADDR:MASTER_PORT a `free_port`); returns the per-rank results in
    rank order. A hang is killed."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_entry, args=(fn, world, out_dir, None if init else free_port(), args), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} on {world} processes did not finish in {timeout:.0f}s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
