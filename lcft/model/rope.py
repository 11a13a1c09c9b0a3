"""Rotary position embedding with HF-compatible scaling (linear, dynamic NTK, YaRN, Llama 3), at any positions.

Frequencies follow transformers' `ROPE_INIT_FUNCTIONS` formula for formula; cos/sin are computed in fp32 for
the given positions only (never a table of max_position_embeddings rows), so 1M-token windows and
context-parallel shards with non-contiguous global positions cost O(L · head_dim / 2).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lcft.errors import LcftError

if TYPE_CHECKING:  # (lcft.model.config runs check_frequencies as it validates a config)
    from lcft.model.config import LlamaConfig


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # (dim/2,)


def _yarn(cfg: LlamaConfig, base: float, dim: int, scaling: dict) -> tuple[torch.Tensor, float]:
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings", cfg.max_position_embeddings)
    if factor is None:
        factor = cfg.max_position_embeddings / original

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 = keep the original (high) frequency, 0 = interpolate
    return interpolation * (1 - keep) + extrapolation * keep, attention_factor


def _llama3(base: float, dim: int, scaling: dict, max_pos: int) -> torch.Tensor:
    inv_freq = _default_inv_freq(base, dim)
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    old_context_len = scaling.get("original_max_position_embeddings", max_pos)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_frequencies(cfg: LlamaConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,) fp32, attention scaling of cos/sin) for a config; `seq_len` matters only for
    `dynamic` scaling (the longest position + 1 of the current call; None = max_position_embeddings)."""
    with torch.device("cpu"):  # also when a model is built under torch.device("meta")
        return _frequencies(cfg, seq_len)


def check_frequencies(cfg: LlamaConfig) -> None:
    """Every inverse frequency of the config finite and non-zero, and its attention scaling too (dynamic scaling at
    max_position_embeddings, as transformers builds it): a rope_theta or factor that passes as a positive number can
    still overflow fp32 (1 / rope_theta^(2i/head_dim) infinite for rope_theta 1e-300, zero for 1e308), and training
    on such angles is NaN. One line naming rope_theta when plain RoPE already fails, else rope_scaling."""
    with torch.device("cpu"):  # also when a config is made under torch.device("meta")
        plain = _default_inv_freq(float(cfg.rope_theta), cfg.head_dim)
        inv_freq, scale = (plain, 1.0) if _bad(plain) else _frequencies(cfg, None)
    if not _bad(inv_freq) and math.isfinite(scale) and scale != 0:
        return
    worst = inv_freq[~(inv_freq.isfinite() & (inv_freq != 0))]
    what = f"a RoPE frequency of {float(worst[0])!r}" if worst.numel() else f"a RoPE attention scaling of {scale!r}"
    field = f"rope_theta={cfg.rope_theta!r}" if inv_freq is plain else \
        f"rope_scaling {cfg.rope_scaling} (with rope_theta={cfg.rope_theta!r})"
    raise LcftError(f"model config: {field} gives {what} at head_dim {cfg.head_dim} (every frequency must be a "
                    "finite, non-zero fp32 number)")


def _bad(inv_freq: torch.Tensor) -> bool:
    return not bool((inv_freq.isfinite() & (inv_freq != 0)).all())


def _frequencies(cfg: LlamaConfig, seq_len: int | None) -> tuple[torch.Tensor, float]:
    base, dim, scaling = float(cfg.rope_theta), cfg.head_dim, cfg.rope_scaling
    kind = scaling["rope_type"] if scaling else "default"
    if kind == "default":
        return _default_inv_freq(base, dim), 1.0
    if kind == "linear":
        return _default_inv_freq(base, dim) / scaling["factor"], 1.0
    if kind == "dynamic":
        max_pos = cfg.max_position_embeddings
        seq_len = max(seq_len or max_pos, max_pos)
        factor = scaling["factor"]
        base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return _default_inv_freq(base, dim), 1.0
    if kind == "yarn":
        return _yarn(cfg, base, dim, scaling)
    if kind == "llama3":
        return _llama3(base, dim, scaling, cfg.max_position_embeddings), 1.0
    raise ValueError(f"unknown rope type {kind!r}")  # LlamaConfig already rejected it


class RotaryEmbedding(nn.Module):
    """cos/sin of the rotation angles at given (global) positions; holds no tables or buffers."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.dynamic = bool(cfg.rope_scaling) and cfg.rope_scaling["rope_type"] == "dynamic"
        self._static = None if self.dynamic else rope_frequencies(cfg)

    def forward(self, position_ids: torch.Tensor, seq_len: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (L,) or (B, L) -> cos, sin each (1 or B, 1, L, head_dim/2) fp32 (broadcast over heads).
        `seq_len` (dynamic scaling only): the full sequence length when this call holds only a shard of it;
        default max(position_ids) + 1, as transformers."""
        if self.dynamic:
            if seq_len is None:
                seq_len = int(position_ids.max()) + 1
            inv_freq, scale = rope_frequencies(self.cfg, seq_len)
        else:
            inv_freq, scale = self._static
        pos = position_ids if position_ids.dim() == 2 else position_ids[None]  # (B or 1, L)
        angles = pos.float()[..., None] * inv_freq.to(pos.device)  # (B, L, D/2) fp32
        cos, sin = angles.cos(), angles.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return cos[:, None], sin[:, None]  # (B, 1, L, D/2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, L, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (B, H, L, D)


class _Rope(torch.autograd.Function):
    """A rotation's gradient is the inverse rotation of the output gradient, so backward needs only cos/sin:
    the projected q/k need not be kept alive for it (HF's version saves them plus a rotated copy)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, L, D) by the angles (B, 1, L, D/2), half-split convention of HF Llama (first half of
    the head dims paired with the second). In x's dtype, as transformers does (cos/sin were computed in fp32
    and are rounded once); positions never need gradients."""
    return _Rope.apply(x, cos.to(x.dtype), sin.to(x.dtype))
