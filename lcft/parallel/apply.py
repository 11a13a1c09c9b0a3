"""Rewire a built model for context parallelism and run its forward on this rank's shard of a window.

The model stays single-process code: `apply_context_parallel` swaps each block's `attn.core` from outside and
`ContextParallelRunner` feeds it the local tokens with their global positions (RoPE), so lcft.model never
imports lcft.parallel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from lcft.errors import LcftError
from lcft.parallel.comms import all_gather_nograd
from lcft.parallel.config import CpConfig
from lcft.parallel.cp_attention import ContextParallelCore
from lcft.parallel.mesh import ParallelState
from lcft.parallel.sharding import ShardLayout, check_length

if TYPE_CHECKING:
    from lcft.model.config import AttentionConfig


def _attention_config(model: nn.Module) -> AttentionConfig:
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "attention"):
        raise ValueError("apply_context_parallel needs an lcft Llama model (with .config.attention)")
    return cfg.attention


def apply_context_parallel(model: nn.Module, state: ParallelState, cfg: CpConfig) -> nn.Module:
    """Swap every block's `attn.core` for a ContextParallelCore (in place; returns the model).

    With cp == 1 the model is left untouched. Parameters and their names do not change, so checkpoints
    written under any cp load under any other."""
    if cfg.cp != state.cp:
        raise ValueError(f"CpConfig.cp={cfg.cp} but the process layout has cp={state.cp}")
    if not state.cp_enabled:
        return model
    attention = _attention_config(model)
    window = getattr(model.config, "sliding_window", None)
    if window is not None and attention.backend == "dense":  # the context-parallel core has no window
        raise LcftError(f"context parallelism with sliding_window={window} and dense attention is not supported "
                        "(use --attention sparse, whose block pattern replaces the window, or cp 1)")
    n = 0
    for module in model.modules():
        if hasattr(module, "core") and isinstance(module.core, nn.Module) and hasattr(module, "q_proj"):
            module.core = ContextParallelCore(attention, state, cfg)
            n += 1
    if n == 0:
        raise ValueError("apply_context_parallel found no attention block with a swappable `core`")
    return model


class ContextParallelRunner:
    """This rank's view of a window under cp, the same for train and eval (lcft.parallel.parallelize returns
    it): shards batches, runs the model with global positions and gathers per-token results back. The loss of a
    rank's tokens is normalised by the trainer (lcft.train.global_step.Normaliser), as on one process."""

    def __init__(self, state: ParallelState, cfg: CpConfig, block_size: int) -> None:
        self.state, self.cfg, self.block = state, cfg, int(block_size)

    def layout(self, length: int) -> ShardLayout:
        """The split of a window of `length` tokens (clear error when length % (2*cp*block) != 0)."""
        return ShardLayout(length, self.state.cp, self.block, self.cfg.cp_layout)

    def check(self, length: int) -> None:
        """Raise LcftError before any work when a window of `length` cannot be split."""
        if self.state.cp_enabled:
            check_length(length, self.state.cp, self.block)

    def shard(self, batch: Mapping[str, torch.Tensor], length: int | None = None
              ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """(this rank's part of every (B, L, ...) tensor, its global positions (L/cp,)); cp == 1: unchanged,
        positions None. `length` defaults to input_ids' length."""
        if not self.state.cp_enabled:
            return dict(batch), None
        length = int(length if length is not None else batch["input_ids"].shape[1])
        layout = self.layout(length)
        dev = batch["input_ids"].device
        return layout.shard_batch(batch, self.state.cp_rank), layout.positions(self.state.cp_rank, device=dev)

    def hidden_states(self, model: nn.Module, input_ids: torch.Tensor, length: int | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final hidden states of this rank's tokens of the full-window `input_ids` (B, L):
        ((B, L/cp, H), positions) — or the plain forward when cp == 1."""
        local, pos = self.shard({"input_ids": input_ids}, length)
        if pos is None:
            return model.hidden_states(input_ids), None
        # Dynamic RoPE scaling depends on the whole window's length, not the shard's.
        h = model.hidden_states(local["input_ids"], position_ids=pos, rope_seq_len=input_ids.shape[1])
        return h, pos

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of a full-window tensor (B, L, ...) -> (B, L/cp, ...); cp == 1: x itself."""
        if not self.state.cp_enabled:
            return x
        return self.layout(x.shape[1]).shard(x, self.state.cp_rank, dim=1)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """Inverse of `local` over the cp group (all-gather, no gradient): every rank's (B, L/cp, ...) part back
        as the whole window (B, L, ...) in window order, on every rank; cp == 1: local itself."""
        if not self.state.cp_enabled:
            return local
        parts = all_gather_nograd(local.contiguous(), self.state.cp_group, tag="window")  # (cp, B, L/cp, ...)
        return self.layout(local.shape[1] * self.state.cp).unshard(list(parts), dim=1)
