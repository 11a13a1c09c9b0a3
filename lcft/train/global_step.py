"""One optimizer step of the global batch, as the trainer takes it: micro-batches forward and backward under one
normaliser, clipping, the spike guard's verdict, the step's record; and the collectives it takes over the world."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from lcft.genomics.dataset import TrainSamples, batch_counts, step_indices
from lcft.parallel.comms import all_reduce_max, all_reduce_sum
from lcft.train.metrics import peak_memory_bytes
from lcft.train.sharded import clip
from lcft.train.step import compute_loss
from lcft.units import bits_per_base

if TYPE_CHECKING:
    from accelerate import Accelerator

    from lcft.checkpoint.state import TrainerState
    from lcft.parallel import ContextParallelRunner, ParallelState
    from lcft.train.config import TrainConfig
    from lcft.train.guard import SpikeGuard
    from lcft.train.trainer import TrainHooks


def world_sum(values: list[float]) -> list[float]:
    """Each value summed over every rank in float64 (comms.STATS counts it under 'loss'); one process: the values."""
    return all_reduce_sum(torch.tensor(values, dtype=torch.float64), None, tag="loss").tolist()


@dataclass(frozen=True)
class Normaliser:
    """The global batch's loss normaliser, known before any forward: every counted token of the step weighs the
    same whatever its split over data-parallel ranks, cp shards and micro-steps."""

    count: float
    """Counted tokens of the global batch."""
    bases: float
    """The bases they cover (the denominator of bits per base)."""
    scale: float
    """Factor on each micro-batch's loss sum before backward."""

    @classmethod
    def of(cls, counts: list[float], cp: int, world: int, accum: int) -> Normaliser:
        """From this rank's [counted tokens, bases] of its whole (unsharded) micro-batches (`batch_counts`)."""
        # Summed over the world; the cp ranks of one group hold the same batch, hence / cp.
        count, bases = (v / cp for v in world_sum(counts))
        # DDP averages gradients over the world and backward() divides by the accumulation steps: undo both.
        return cls(count, bases, world * accum / max(count, 1.0))

    def per_token(self, total: float) -> float:
        """A sum over the global batch's tokens as a per-token mean (0 when no token counts, never NaN)."""
        return total / max(self.count, 1.0)


class GlobalStep:
    """The global batch's step (`_step`) and the collectives it and the loop take: a base of Trainer
    (lcft.train.trainer), which builds what they use."""

    cfg: TrainConfig
    hooks: TrainHooks
    state: TrainerState
    layout: ParallelState
    world: int
    accum: int
    seq_len: int
    samples: TrainSamples
    acc: Accelerator
    lm: torch.nn.Module
    cp_runner: ContextParallelRunner
    opt: Any
    scheduler: Any
    guard: SpikeGuard

    # ---- collectives (no-ops on one process; the loss sums: `world_sum`; both through lcft.parallel.comms) ----
    def _max(self, values: list[int]) -> list[int]:
        """Each value's max over every rank (comms.STATS counts it under 'max'); one process: the values."""
        return all_reduce_max(torch.tensor(values, dtype=torch.int64), None).tolist()

    def _gather_samples(self, mine: list[tuple[int, int]]) -> list[int]:
        """Sample ids of the whole global batch in batch order, from what each rank actually loaded."""
        pairs = [mine]
        if self.world > 1:
            pairs = [None] * self.world
            dist.all_gather_object(pairs, mine)
        by_pos = {pos: sid for rank_pairs in pairs for pos, sid in rank_pairs}
        return [by_pos[k] for k in sorted(by_pos)]

    def _step(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.state
        step = st.step + 1
        if self.hooks.before_step:
            self.hooks.before_step(step)
        t0 = time.perf_counter()
        groups = step_indices(st.samples_seen, cfg.global_batch, cfg.micro_batch, self.layout.dp_rank, self.layout.dp)
        ids = [[self.samples.sample_id(g) for g in micro] for micro in groups]
        batches = [self.samples.batch(m) for m in ids]
        norm = Normaliser.of(batch_counts(batches, self.samples.label_bases), cfg.cp, self.world, self.accum)
        loss_sum = ce_sum = 0.0
        for batch in batches:
            batch = {k: v.to(self.acc.device) for k, v in batch.items()}
            with self.acc.accumulate(self.lm):
                ls, _, ce = compute_loss(self.lm, batch, self.cp_runner)
                if self.hooks.perturb_loss:
                    ls = self.hooks.perturb_loss(step, ls)
                self.acc.backward(ls * norm.scale)
            loss_sum, ce_sum = loss_sum + ls.detach().double().item(), ce_sum + ce.double().item()
        loss_sum, ce_sum = world_sum([loss_sum, ce_sum])
        objective = norm.per_token(loss_sum)
        # the plain cross-entropy (nats per token): no soft-mask weights, z-loss or router loss in the figure
        loss = norm.per_token(ce_sum)
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
        grad_norm = clip(self.acc, self.lm, max_norm, self.layout)  # fsdp: the global norm over the shards
        lr = self.opt.param_groups[0]["lr"]
        verdict = "empty" if norm.count == 0 else self.guard.check(objective, grad_norm)
        if verdict == "ok":
            self.opt.step()
            self.scheduler.step()
            st.updates += 1
            st.consecutive_skips = 0
            self.guard.record(objective)
        else:
            st.skipped += 1
            st.consecutive_skips = 0 if verdict == "empty" else st.consecutive_skips + 1
        self.opt.zero_grad(set_to_none=True)
        st.step, st.samples_seen = step, st.samples_seen + cfg.global_batch
        st.guard_history, st.last_loss = list(self.guard.history), loss
        mine = [(g - (st.samples_seen - cfg.global_batch), s)
                for grp, sids in zip(groups, ids, strict=True) for g, s in zip(grp, sids, strict=True)]
        samples = self._gather_samples(mine)
        if self.acc.device.type == "cuda":  # the optimizer's kernels are still queued: count them in this step
            torch.cuda.synchronize(self.acc.device)
        peak = self._max([peak_memory_bytes(self.acc.device)])[0]
        dt = time.perf_counter() - t0
        record = {"step": step, "loss": loss, "bits_per_base": bits_per_base(loss, norm.count, norm.bases), "lr": lr,
                  "grad_norm": grad_norm, "tokens_per_s": cfg.global_batch * self.seq_len / dt, "peak_mem": peak,
                  "skipped": st.skipped, "elapsed": 0.0, "samples": samples}
        if verdict != "ok":
            record["skip"] = verdict if verdict != "empty" else "empty (every label ignored: all-N windows?)"
            # what the guard judged: the objective (soft-mask weights, z-loss, router loss), not the logged loss
            record["objective"] = objective
        return record
