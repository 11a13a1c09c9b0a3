"""Grouped-query attention with RoPE, and the swappable attention cores (dense SDPA/flash-attn, sparse).

`Attention` computes q, k, v for its tokens, rotates them at the given positions and hands them to
`self.core(q, k, v)`. The core is causal in the token order of its inputs; lcft.parallel replaces it with a
context-parallel core from outside, which is why the core sees only q/k/v and no positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lcft.model.config import AttentionConfig, LlamaConfig
from lcft.model.layers import RMSNorm, flash_attn_for
from lcft.model.rope import apply_rope
from lcft.model.window import SlidingWindowCore


class DenseCore(nn.Module):
    """Causal attention over all earlier tokens: flash-attn on CUDA in half precision when installed,
    else torch SDPA (its flash/efficient kernels keep memory O(L) on CPU and GPU)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q (B, Hq, L, D); k, v (B, Hkv, L, D) -> (B, Hq, L, D)
        if (flash := flash_attn_for(q)) is not None:  # flash-attn wants (B, L, H, D) and handles GQA itself
            return flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class SparseCore(nn.Module):
    """Block-sparse causal attention from lcft.kernels over the key blocks the spec's selector picks
    (per KV group, see docs/design.md, Sparse attention)."""

    def __init__(self, cfg: AttentionConfig) -> None:
        super().__init__()
        # Imported here, not at module level: the kernels load only when a sparse model is built.
        from lcft.kernels.selectors import get_selector
        from lcft.kernels.sparse import sparse_attention

        get_selector(cfg.sparse.selector)  # an unknown selector fails when the model is built, not mid-step
        self.spec, self.impl, self._attend = cfg.sparse, cfg.impl, sparse_attention

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._attend(q, k, v, self.spec, impl=self.impl)  # (B, Hq, L, D)


def make_core(cfg: AttentionConfig) -> nn.Module:
    """The attention core a config asks for."""
    return SparseCore(cfg) if cfg.backend == "sparse" else DenseCore()


class Attention(nn.Module):
    """Grouped-query self-attention: projections, RoPE at the given positions, core, output projection."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        # Qwen3: RMSNorm over each head's D dims of q and k, before RoPE (outside the core, so the
        # context-parallel core swap keeps it)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.core = make_core(cfg.attention)
        if cfg.sliding_window is not None and cfg.attention.backend == "dense":
            self.core = SlidingWindowCore(cfg.sliding_window, self.core)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, H) -> q (B, Hq, L, D), k and v (B, Hkv, L, D), q and k rotated by the angles (B, 1, L, D/2)."""
        b, n, _ = x.shape  # (B, L, H)
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        # One matmul for q, k and v (the weights stay separate parameters, named as in HF): one pass over x
        # forward and one grad-input product backward instead of three.
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # ((Hq+2Hkv)·D, H)
        bias = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        q, k, v = F.linear(x, w, bias).split([hq * d, hkv * d, hkv * d], dim=-1)  # (B, L, H·D) each
        q = q.view(b, n, hq, d)  # (B, L, Hq, D)
        k = k.view(b, n, hkv, d)  # (B, L, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, over D
        q = q.transpose(1, 2)  # (B, Hq, L, D)
        k = k.transpose(1, 2)  # (B, Hkv, L, D)
        # v contiguous: then nothing saved for backward points into the fused qkv buffer, which is freed
        v = v.view(b, n, hkv, d).transpose(1, 2).contiguous()  # (B, Hkv, L, D)
        # Under autocast over fp32 weights the q/k norms return fp32 (HF's gain x normed): the core gets v's dtype,
        # as SDPA's autocast would cast them (the sparse kernels and flash-attn take one dtype).
        return apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype), v

    def out_proj(self, out: torch.Tensor) -> torch.Tensor:
        """The core's output (B, Hq, L, D) -> (B, L, H)."""
        b, hq, n, d = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, n, hq * d))  # (B, L, H)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.core(*self.qkv(x, cos, sin)))  # (B, L, H)
