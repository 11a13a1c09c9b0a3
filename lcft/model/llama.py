"""The Llama decoder: embedding, blocks of (RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU), final norm, head;
the HF families' variants as config flags (q/k/v bias, Qwen3's q/k norm, sliding window, Mixtral's experts).

Single-process by design: lcft.parallel shards a built model from outside (by swapping each block's
`attn.core` and passing global `position_ids`), so nothing here knows about process groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lcft.errors import LcftError
from lcft.model.attention import Attention
from lcft.model.config import LlamaConfig
from lcft.model.layers import MLP, RMSNorm
from lcft.model.moe import MoE, load_balancing_loss
from lcft.model.rope import RotaryEmbedding

# Tokens per chunk of a block's token-wise work under block checkpointing: the tiny preset's chunk transients
# are then ~50 MiB (fp32) whatever the sequence length. Measured on the tiny shape at 16K tokens, fp32: peak RSS
# 1.55 GiB with 16K chunks, 1.22 GiB with 4K, 1.16 GiB with 2K, at the same step time (20.5, 20.1, 21.3 s).
DEFAULT_SEQ_CHUNK = 4096


class Block(nn.Module):
    """One pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(.)); the MLP is Mixtral's mixture of
    experts when the config has num_local_experts."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp: nn.Module = (MoE(cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts,
                                   cfg.num_experts_per_tok)
                               if cfg.num_local_experts else MLP(cfg.hidden_size, cfg.intermediate_size))
        self.router_stats = bool(cfg.num_local_experts and cfg.output_router_logits)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_chunk: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (output (B, L, H), the MoE router statistics (2, E) when the load-balancing loss is on, else None).
        seq_chunk > 0: the token-wise work (norms, projections, RoPE, MLP) runs seq_chunk tokens at a time,
        each chunk under its own checkpoint when grad is on, so its transients are chunk-sized; only the
        attention core sees the whole sequence. Same numbers as the plain path."""
        if seq_chunk <= 0 or x.shape[1] <= seq_chunk:
            h = x + self.attn(self.attn_norm(x), cos, sin)  # (B, L, H)
            return self._mlp(h)
        xs = x.split(seq_chunk, dim=1)  # (B, C, H) each; split, not narrow: one backward node, no full-size zeros
        cs, ss = cos.split(seq_chunk, dim=2), sin.split(seq_chunk, dim=2)  # (B or 1, 1, C, D/2) each
        qkv = [_per_chunk(self._qkv, xc, c, s) for xc, c, s in zip(xs, cs, ss, strict=True)]
        q, k, v = (torch.cat(parts, dim=2) for parts in zip(*qkv, strict=True))  # (B, Hq or Hkv, L, D)
        del qkv
        out = self.attn.core(q, k, v)  # (B, Hq, L, D)
        del q, k, v
        outs = out.split(seq_chunk, dim=2)  # (B, Hq, C, D) each
        parts = [_per_chunk(self._tail, xc, oc) for xc, oc in zip(xs, outs, strict=True)]
        stats = torch.stack([p[1] for p in parts]).sum(0) if self.router_stats else None  # (2, E)
        return torch.cat([p[0] for p in parts], dim=1), stats  # (B, L, H)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.attn.qkv(self.attn_norm(x), cos, sin)  # (B, Hq or Hkv, C, D) each

    def _tail(self, x: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._mlp(x + self.attn.out_proj(out))  # (B, C, H)

    def _mlp(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(self.mlp, MoE):
            y, stats = self.mlp(self.mlp_norm(h), with_stats=self.router_stats)  # (B, L, H), (2, E) | None
            return h + y, stats
        return h + self.mlp(self.mlp_norm(h)), None  # (B, L, H)


def _per_chunk(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    """fn(*args), under a non-reentrant checkpoint when grad is on: keeps only the (chunk-sized) inputs and
    recomputes the chunk in backward (nests inside the block checkpoint)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)


class Llama(nn.Module):
    """Llama-style causal LM whose parameters map one-to-one onto the HF class of its config's model_type
    (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM; lcft.model.hf)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg)
        self.checkpointing: Literal["none", "block"] = "none"
        self.offload = False
        self.seq_chunk = 0
        self.aux_loss: torch.Tensor | None = None
        """MoE load-balancing loss of the last hidden_states call (when output_router_logits), unscaled."""
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """HF's initialisation: normal(0, initializer_range) for linear and embedding weights, zero biases,
        ones for norms."""
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                m.weight.normal_(0.0, self.config.initializer_range)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """(vocab, hidden) weight of the LM head (the embedding's when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_activation_checkpointing(self, mode: Literal["none", "block"] = "block", offload: bool = False,
                                     seq_chunk: int = DEFAULT_SEQ_CHUNK) -> None:
        """'block': keep only each block's input and recompute the block in backward (non-reentrant
        torch.utils.checkpoint). offload: keep what is saved in CPU memory — with 'block' the block inputs
        (moved to CPU before the checkpoint, back on the fly in forward and recompute), with 'none' every
        activation a block saves (torch.autograd.graph.save_on_cpu). seq_chunk (with 'block'; 0 = off): run
        each block's token-wise work (norms, projections, RoPE, MLP) that many tokens at a time, each chunk
        under its own nested checkpoint, so a block's transients in forward and in the backward recompute
        are chunk-sized instead of sequence-sized (also applies without grad)."""
        if mode not in ("none", "block"):
            raise LcftError(f"activation checkpointing mode {mode!r} is not one of none, block")
        if isinstance(seq_chunk, bool) or not isinstance(seq_chunk, int) or seq_chunk < 0:
            raise LcftError(f"seq_chunk must be a non-negative integer, got {seq_chunk!r}")
        self.checkpointing, self.offload = mode, bool(offload)
        self.seq_chunk = seq_chunk if mode == "block" else 0

    def positions(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, position_offset: int
                  ) -> torch.Tensor:
        """Global positions of the tokens: given ones (any order), else offset + 0..L-1."""
        if position_ids is None:
            return torch.arange(input_ids.shape[-1], device=input_ids.device) + position_offset  # (L,)
        if position_offset:
            raise LcftError("give either position_ids or position_offset, not both")
        if position_ids.shape[-1] != input_ids.shape[-1]:
            raise LcftError(f"position_ids cover {position_ids.shape[-1]} tokens, input_ids {input_ids.shape[-1]}")
        return position_ids.to(input_ids.device)

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, *,
                      position_offset: int = 0, rope_seq_len: int | None = None) -> torch.Tensor:
        """input_ids (B, L) -> final-norm hidden states (B, L, H), for the chunked loss.
        position_ids: global positions (L,) or (B, L) in any order (default position_offset + arange(L)).
        rope_seq_len: full sequence length for dynamic RoPE scaling when the call holds a shard of it."""
        if input_ids.dtype not in (torch.int32, torch.int64):
            input_ids = input_ids.long()  # windows are stored as uint8
        pos = self.positions(input_ids, position_ids, position_offset)
        cos, sin = self.rotary(pos, seq_len=rope_seq_len)  # (B or 1, 1, L, D/2) fp32
        x = self.embed_tokens(input_ids)  # (B, L, H)
        stats = []
        for block in self.layers:
            x, s = self._run_block(block, x, cos, sin)
            if s is not None:
                stats.append(s)
        self.aux_loss = None
        if stats:  # HF: one loss over the router outputs of all layers together
            rows = input_ids.numel() * len(stats)
            self.aux_loss = load_balancing_loss(torch.stack(stats).sum(0), rows, self.config.num_local_experts)
        return self.norm(x)  # (B, L, H)

    def _run_block(self, block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = self.seq_chunk
        if not torch.is_grad_enabled():
            return block(x, cos, sin, n)
        if self.checkpointing == "block":
            if self.offload:
                device = x.device
                # The checkpoint keeps its inputs alive until backward: hand it a CPU copy (autograd sends the
                # gradient back to the device through the copy).
                return checkpoint(lambda xc, c, s: block(xc.to(device, non_blocking=True), c, s, n),
                                  x.to("cpu"), cos, sin, use_reentrant=False)
            return checkpoint(block, x, cos, sin, n, use_reentrant=False)
        if self.offload:
            with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
                return block(x, cos, sin)
        return block(x, cos, sin)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, *,
                position_offset: int = 0, rope_seq_len: int | None = None) -> torch.Tensor:
        """input_ids (B, L) -> logits (B, L, vocab), as transformers returns them (small inputs, tests)."""
        h = self.hidden_states(input_ids, position_ids, position_offset=position_offset, rope_seq_len=rope_seq_len)
        return F.linear(h, self.lm_head_weight)  # (B, L, V)
