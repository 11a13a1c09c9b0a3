"""Context- and data-parallel evaluation: `lcft eval --nproc N --cp C` (the hooks the eval passes call).

cp ranks share each window (sharded as in training; per-token losses are all-gathered back into window order
on every rank); the dp groups take turns over the batches of windows, and every rank receives all groups'
results in window order, so rank 0 accumulates exactly what one process would. lcft.launch starts the ranks
with torchrun, as for `lcft train --nproc`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lcft.errors import LcftError
from lcft.liveness import launched
from lcft.parallel.apply import ContextParallelRunner
from lcft.parallel.config import ParallelConfig
from lcft.parallel.mesh import init_parallel, init_world
from lcft.parallel.parallelize import ParallelizeConfig, parallelize


class EvalParallel:
    """This rank's part of a parallel evaluation: process groups, CP model rewiring, window rounds."""

    def __init__(self, cfg: ParallelConfig, device: torch.device,
                 same_run: Callable[[], dict[str, str]] | None = None) -> None:
        # under a launch: the process group, its timeout, the heartbeat, and every node running the same
        # evaluation (`same_run`: this rank's fingerprint, lcft.parallel.same_run)
        init_world(cfg.collective_timeout, same_run)
        self.cfg, self.device = cfg, device
        self.state = init_parallel(cfg)  # clear error when the world does not split into cp groups
        self.is_main = self.state.is_main

    def check(self, window: int, block_size: int, max_contexts: list[int]) -> None:
        """Every sequence the model will see (the window, or its --max-context pieces) must split over cp."""
        if not self.state.cp_enabled:
            return
        runner = ContextParallelRunner(self.state, self.cfg, block_size)
        for ctx in {c for c in max_contexts if c} | {window}:
            if window % ctx:
                raise LcftError(f"--max-context {ctx} does not divide the window ({window}) under --cp "
                                f"{self.state.cp}: every piece must split over the cp ranks")
            runner.check(ctx)

    def prepare(self, model: nn.Module) -> nn.Module:
        """The training run's parallelize step on the model (for eval only its context-parallel core swap, a
        no-op for cp=1) and its runner."""
        self.runner = parallelize(model, self.state, ParallelizeConfig(self.cfg, device=self.device))
        return model

    def piece_losses(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-token loss (N, C) fp32 of full sequences x (N, C) at positions 0..C-1 with labels y: each cp rank
        runs its shard (the runner's, as in training), then the shards are gathered back into sequence order."""
        from lcft.kernels import per_token_loss

        hidden, _ = self.runner.hidden_states(model, x)  # (N, C/cp, H)
        loss = per_token_loss(hidden, model.lm_head_weight, self.runner.local(y)).float()  # (N, C/cp)
        return self.runner.gather(loss)  # (N, C)

    def batches(self, n_windows: int, batch_size: int, start: int = 0) -> Iterator[list[int]]:
        """This dp group's batch of each round (round i: batch i*dp + dp_rank) of windows start..n-1; every
        group runs the same number of rounds (an empty batch when it has none), so the collectives stay matched."""
        starts = list(range(start, n_windows, batch_size))
        dp, me = self.state.dp, self.state.dp_rank
        for first in range(0, len(starts), dp):
            mine = first + me
            yield list(range(starts[mine], min(starts[mine] + batch_size, n_windows))) if mine < len(starts) else []

    def gather(self, batch: list[int], loss: torch.Tensor | None, counted: torch.Tensor | None
               ) -> list[tuple[int, Any, Any]]:
        """(window index, loss (L,), counted (L,)) of every dp group's batch of this round, in window order."""
        mine = [] if not batch else [(i, loss[j].cpu().numpy(), counted[j].cpu().numpy())
                                     for j, i in enumerate(batch)]
        if self.state.dp == 1:
            return mine
        everyone: list[Any] = [None] * self.state.world
        dist.all_gather_object(everyone, mine if self.state.cp_rank == 0 else [])
        return sorted((item for part in everyone for item in part), key=lambda t: t[0])

    def share(self, obj: Any) -> Any:
        """Global rank 0's `obj` on every rank (what only the main rank reads: kept losses of a killed run)."""
        if self.state.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def max(self, value: int) -> int:
        """The largest of every rank's `value` (every rank calls this at the same point)."""
        if self.state.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def close(self) -> None:
        """Under a launch (torchrun, `--nproc`), tear the process group down before the interpreter exits."""
        if dist.is_initialized() and launched():
            dist.destroy_process_group()
