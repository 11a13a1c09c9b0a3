"""One micro-batch's loss (`compute_loss`, the place context parallelism shards), AdamW and its schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lcft.kernels import chunked_cross_entropy
from lcft.model import Llama
from lcft.train.config import OptimConfig, TrainConfig

if TYPE_CHECKING:
    from lcft.parallel import ContextParallelRunner


class LossModel(nn.Module):
    """The decoder and its chunked loss in one forward: DDP and Accelerate's autocast wrap forward(), so the
    whole micro-step must be a single call of it (calling `hidden_states` on the wrapped model would bypass
    DDP's gradient synchronisation)."""

    def __init__(self, model: Llama, z_loss: float, chunk: int) -> None:
        super().__init__()
        self.model, self.z_loss, self.chunk = model, z_loss, chunk

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, rope_seq_len: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss_sum, count, ce_sum): summed weighted token loss incl. z-loss (and the MoE router loss when the
        model has output_router_logits), counted tokens, and their plain cross-entropy Σ ce (unweighted, without
        z-loss or router loss: what the metrics report, comparable with `lcft eval`'s)."""
        hidden = self.model.hidden_states(input_ids, position_ids, rope_seq_len=rope_seq_len)  # (B, L, H)
        loss_sum, count, ce_sum = chunked_cross_entropy(hidden, self.model.lm_head_weight, labels, weights=weights,
                                                        chunk=self.chunk, z_loss=self.z_loss, with_ce=True)
        aux = self.model.aux_loss
        if aux is not None:  # a mean over this micro-batch's tokens (this rank's, under cp): x count to a sum
            loss_sum = loss_sum + self.model.config.router_aux_loss_coef * aux * count
        return loss_sum, count, ce_sum


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor],
                 cp: ContextParallelRunner | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward of one micro-batch on this rank: (loss_sum, count, ce_sum), sums over the tokens it holds.

    `model` is the prepared (possibly DDP-wrapped) LossModel. Context parallelism shards here: it keeps this
    rank's tokens of input_ids/labels/weights (B, L) and passes their global position_ids and the full
    rope_seq_len; the trainer divides by the global count of the whole step and DDP averages over all ranks.
    """
    if cp is not None and cp.state.cp_enabled:
        # `cp` holds this rank's place in its cp group. The sums cover only this rank's tokens: the trainer's
        # normaliser (global count, x world size against DDP's average) makes the summed gradient exact.
        local, positions = cp.shard(batch)
        return model(local["input_ids"], local["labels"], local.get("weights"), position_ids=positions,
                     rope_seq_len=batch["input_ids"].shape[1])
    return model(batch["input_ids"], batch["labels"], batch.get("weights"))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Matrices (embeddings, projections) decay; vectors (norm gains) do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    plain = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                             betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)


def lr_factor(update: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for the given applied-update index (0-based): linear warm-up from 1/warmup to 1
    over `warmup` updates, then cosine down to min_ratio at update `total`."""
    if update < warmup:
        return (update + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (update - warmup) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per applied update (skipped updates leave it where it is)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda u: lr_factor(u, cfg.warmup, cfg.steps, cfg.min_lr_ratio))


def warmup_note(cfg: OptimConfig, step: int, updates: int) -> str | None:
    """A note when every update this invocation makes (from `step`, the schedule at `updates`) is a warm-up one:
    the run then ends below the peak --lr, or just at it, and never decays; silently, a short test run's losses
    read as if trained at --lr."""
    left = cfg.steps - step
    if left <= 0 or updates + left > cfg.warmup:
        return None
    last = cfg.lr * lr_factor(updates + left - 1, cfg.warmup, cfg.steps, cfg.min_lr_ratio)
    steps = (f"--steps {cfg.steps}" if step == 0
             else f"the {left} step{'s' if left > 1 else ''} left of --steps {cfg.steps}")
    return (f"note: --warmup {cfg.warmup} covers {steps}: the learning rate only rises, to {last:.2e} of the "
            f"--lr {cfg.lr:.2e} peak, and never decays (a smaller --warmup or more --steps leaves warm-up)")


def oom_message(cfg: TrainConfig, seq_len: int, precision: str, backend: str) -> str:
    """What to say when a step runs out of memory: the sizes that matter and the options that reduce it."""
    tips = []
    if cfg.micro_batch > 1:
        tips.append(f"--micro-batch 1 (more accumulation; now {cfg.micro_batch})")
    if cfg.checkpointing != "block":
        tips.append("--checkpointing block")
    elif not cfg.offload_activations:
        tips.append("--offload-activations")
    if backend != "sparse":
        tips.append("--attention sparse")
    if precision != "bf16":
        tips.append("--precision bf16")
    tips.append(f"--cp N (context parallel over N ranks; now {cfg.cp})")
    tips.append(f"a shorter --seq-len (now {seq_len})")
    tips.append(f"a smaller --loss-chunk (now {cfg.loss_chunk})")
    return (f"out of memory at --seq-len {seq_len} x --micro-batch {cfg.micro_batch}, precision {precision}; "
            f"options that reduce memory: {', '.join(tips)}")
