"""Reference block-sparse attention: plain PyTorch with an explicit dense mask (the oracle; small shapes only)."""

from __future__ import annotations

import math

import torch


def block_mask_from_indices(indices: torch.Tensor, n_k_blocks: int) -> torch.Tensor:
    """(B, Hkv, nQ, budget) ids (-1 padded) -> (B, Hkv, nQ, nK) bool: which key blocks each query block reads."""
    b, h, n_q, _ = indices.shape
    mask = torch.zeros(b, h, n_q, n_k_blocks + 1, dtype=torch.bool, device=indices.device)
    idx = torch.where(indices < 0, n_k_blocks, indices.long())  # padding goes to a dump column
    mask.scatter_(3, idx, True)
    return mask[..., :n_k_blocks]


def token_mask(indices: torch.Tensor, block_size: int, lk: int, q_block_offset: int) -> torch.Tensor:
    """(B, Hkv, Lq, Lk) bool: key block chosen and key position <= query position (global positions)."""
    n_q = indices.shape[2]
    blocks = block_mask_from_indices(indices, lk // block_size)  # (B, Hkv, nQ, nK)
    dense = blocks.repeat_interleave(block_size, dim=2).repeat_interleave(block_size, dim=3)  # (B, Hkv, Lq, Lk)
    q_pos = q_block_offset * block_size + torch.arange(n_q * block_size, device=indices.device)  # (Lq,)
    k_pos = torch.arange(lk, device=indices.device)  # (Lk,)
    return dense & (k_pos[None, :] <= q_pos[:, None])


def sparse_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Attention of q (B, Hq, Lq, D) over k, v (B, Hkv, Lk, D) restricted to the chosen blocks, causal.

    Written as explicit matmul + masked softmax (not SDPA) so that it shares no code with the kernels it checks.
    Rows with no visible key would be NaN; selection always includes the own block, so they do not occur.
    """
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = hq // hkv
    mask = token_mask(indices, block_size, lk, q_block_offset)  # (B, Hkv, Lq, Lk)
    mask = mask.repeat_interleave(group, dim=1)  # (B, Hq, Lq, Lk)
    kk = k.repeat_interleave(group, dim=1)  # (B, Hq, Lk, D)
    vv = v.repeat_interleave(group, dim=1)  # (B, Hq, Lk, D)
    scores = (q.float() @ kk.float().transpose(-1, -2)) / math.sqrt(d)  # (B, Hq, Lq, Lk)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, Hq, Lq, Lk)
    return (probs @ vv.float()).to(q.dtype)  # (B, Hq, Lq, D)
