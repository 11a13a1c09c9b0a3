"""The Llama decoder: embedding, blocks of (RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU), final norm, head;
the HF families' variants as config flags (q/k/v bias, Qwen3's q/k norm, sliding window, Mixtral's experts).

Single-process by design: lcft.parallel shards a built model from outside (by swapping each block's
`attn.core` and passing global `position_ids`), so nothing here knows about process groups.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from lcft.model.attention import Attention
from lcft.model.config import LlamaConfig
from lcft.model.layers import MLP, RMSNorm
from lcft.model.moe import MoE, load_balancing_loss
from lcft.model.rope import RotaryEmbedding


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (output (B, L, H), the MoE router statistics (2, E) when the load-balancing loss is on, else None).
        The same as tail(x, attn.core(*qkv(x, cos, sin))), the pieces lcft.parallel.activations runs a chunk of
        tokens at a time."""
        h = x + self.attn(self.attn_norm(x), cos, sin)  # (B, L, H)
        return self._mlp(h)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block's input x (B, L, H) -> q, k, v of its attention (the token-wise part before the core)."""
        return self.attn.qkv(self.attn_norm(x), cos, sin)  # (B, Hq or Hkv, C, D) each

    def tail(self, x: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block's input x (B, L, H) and its attention core's output (B, Hq, L, D) -> the block's output."""
        return self._mlp(x + self.attn.out_proj(out))  # (B, C, H)

    def _mlp(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(self.mlp, MoE):
            y, stats = self.mlp(self.mlp_norm(h), with_stats=self.router_stats)  # (B, L, H), (2, E) | None
            return h + y, stats
        return h + self.mlp(self.mlp_norm(h)), None  # (B, L, H)


class Llama(nn.Module):
    """Llama-style causal LM whose parameters map one-to-one onto the HF class of its config's model_type
    (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM;
    lcft.model.hf_params)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = _embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg)
        self.aux_loss: torch.Tensor | None = None
        """MoE load-balancing loss of the last hidden_states call (when output_router_logits), unscaled."""
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """HF's initialisation: normal(0, initializer_range) for linear and embedding weights, zero biases,
        ones for norms."""
        for m in self.modules():
            if any(p.is_meta for p in m.parameters(recurse=False)):  # nothing to set: filled from files later
                continue
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

    def positions(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, position_offset: int
                  ) -> torch.Tensor:
        """Global positions of the tokens: given ones (any order), else offset + 0..L-1."""
        if position_ids is None:
            return torch.arange(input_ids.shape[-1], device=input_ids.device) + position_offset  # (L,)
        if position_offset:
            raise ValueError("give either position_ids or position_offset, not both")
        if position_ids.shape[-1] != input_ids.shape[-1]:
            raise ValueError(f"position_ids cover {position_ids.shape[-1]} tokens, input_ids {input_ids.shape[-1]}")
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
            x, s = block(x, cos, sin)
            if s is not None:
                stats.append(s)
        self.aux_loss = None
        if stats:  # HF: one loss over the router outputs of all layers together
            rows = input_ids.numel() * len(stats)
            self.aux_loss = load_balancing_loss(torch.stack(stats).sum(0), rows, self.config.num_local_experts)
        return self.norm(x)  # (B, L, H)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, *,
                position_offset: int = 0, rope_seq_len: int | None = None) -> torch.Tensor:
        """input_ids (B, L) -> logits (B, L, vocab), as transformers returns them (small inputs, tests)."""
        h = self.hidden_states(input_ids, position_ids, position_offset=position_offset, rope_seq_len=rope_seq_len)
        return F.linear(h, self.lm_head_weight)  # (B, L, V)


def _embedding(num: int, dim: int) -> nn.Embedding:
    """nn.Embedding(num, dim); on the meta device (a model whose weights come from files, or only its shapes)
    without nn.Embedding's own normal_ init: on meta that runs a reference kernel that imports torch._dynamo (and
    with it sympy, FSDP and DTensor: 1-2 s of a process's start). Elsewhere as before, so seeded weights are the
    same."""
    if torch.get_default_device().type == "meta":
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))  # (num, dim), on meta: no storage, no values
    return nn.Embedding(num, dim)


def parameter_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every parameter of Llama(cfg), in its order, without building its blocks: a one-block model
    on the meta device is the template, its block's parameters repeated for every layer. What a config.json
    implies costs one block to learn, not the model it declares (compared with a weight file before that)."""
    with torch.device("meta"):
        one = Llama(dataclasses.replace(cfg, num_hidden_layers=1))
    params = [(n, tuple(p.shape)) for n, p in one.named_parameters()]
    block = [(n.removeprefix("layers.0."), shape) for n, shape in params if n.startswith("layers.0.")]
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in params:
        if name == f"layers.0.{block[0][0]}":
            out.update((f"layers.{i}.{n}", s) for i in range(cfg.num_hidden_layers) for n, s in block)
        elif not name.startswith("layers.0."):
            out[name] = shape
    return out
