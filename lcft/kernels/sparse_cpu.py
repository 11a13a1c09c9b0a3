"""Chunked block-sparse attention in PyTorch (custom autograd Function): the implementation that runs on CPU.

Forward walks the query blocks in small chunks (a few blocks, so each chunk's scores stay in cache), gathers the
selected K/V blocks, and keeps only the output; backward recomputes the probabilities per chunk (flash-attention
style; a chunk holds whole rows, so the log-sum-exp is not needed either). Memory is O(L · budget · block) for indices plus O(chunk · budget · block²) scratch,
never O(L²). Only the own (diagonal) block needs the causal mask: every other chosen block lies wholly before it.
"""

from __future__ import annotations

import math

import torch

# Scratch target per chunk (score entries); small enough that scores stay in the per-core cache.
_CHUNK_SCORE_ELEMS = 1 << 17


class BlockPlan:
    """Gather indices for one call: row r of each query block = its non-own chosen blocks, then its own block.

    `flat` indexes the (B·Hkv·nK, block, D) view of k and v; padding slots point at block 0 of their head and
    are masked to -inf, so their probabilities (and thus their gradient contributions) are exactly zero.
    """

    def __init__(self, indices: torch.Tensor, n_k: int, q_block_offset: int) -> None:
        b, hkv, n_q, s = indices.shape
        idx = indices.long()  # (B, Hkv, nQ, S)
        own = torch.arange(q_block_offset, q_block_offset + n_q, device=idx.device)[:, None]  # (nQ, 1)
        others = torch.where(idx == own, -1, idx)  # (B, Hkv, nQ, S); exactly one own entry was removed
        others = others.sort(dim=-1, descending=True).values[..., : s - 1]  # (B, Hkv, nQ, W) valid first
        self.width = s - 1  # W: non-own slots per query block
        self.valid = others >= 0  # (B, Hkv, nQ, W)
        # Query blocks with padding slots (the first few, for selection output): only their chunks need masking.
        self.padded = (~self.valid).any(-1).flatten(0, 1).any(0).tolist()  # nQ bools
        base = (torch.arange(b * hkv, device=idx.device) * n_k).view(b, hkv, 1, 1)  # (B, Hkv, 1, 1)
        own_flat = base + own.expand(n_q, 1)  # (B, Hkv, nQ, 1)
        self.flat = torch.cat([base + others.clamp(min=0), own_flat], dim=-1)  # (B, Hkv, nQ, W + 1)


def _chunk_size(b: int, hkv: int, group: int, block: int, slots: int) -> int:
    per_block = b * hkv * group * block * slots * block  # score entries of one query block
    return max(1, _CHUNK_SCORE_ELEMS // per_block)


def _probs(
    qc: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, plan: BlockPlan, i0: int, i1: int, tri: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention probabilities of one chunk, with its gathered keys, values and their flat ids.

    qc: (B, Hkv, C, G·block, D) pre-scaled queries; tri: (block, block) causal bias of the own block.
    A chunk holds whole rows (every chosen block of its queries), so softmax needs no running max: p is
    recomputed identically in backward and no log-sum-exp has to be kept. Scores stay in the input dtype
    (bf16 matmuls accumulate in fp32); torch.softmax computes in fp32 internally.
    Returns p (B, Hkv, C, G·block, (W+1)·block), kg and vg (B, Hkv, C, (W+1)·block, D), flat (B, Hkv, C, W+1).
    """
    b, hkv, c, rows, d = qc.shape
    block, w = tri.shape[0], plan.width
    flat = plan.flat[:, :, i0:i1].reshape(-1)  # (B·Hkv·C·(W+1),)
    kg = kb.index_select(0, flat).view(b, hkv, c, (w + 1) * block, d)  # (B, Hkv, C, (W+1)·block, D)
    vg = vb.index_select(0, flat).view(b, hkv, c, (w + 1) * block, d)  # (B, Hkv, C, (W+1)·block, D)
    s = qc @ kg.transpose(-1, -2)  # (B, Hkv, C, G·block, (W+1)·block)
    s6 = s.view(b, hkv, c, rows // block, block, w + 1, block)
    s6[..., w, :] += tri
    if any(plan.padded[i0:i1]):
        pad = torch.zeros(b, hkv, c, w + 1, dtype=s.dtype, device=s.device)  # (B, Hkv, C, W+1)
        pad[..., :w].masked_fill_(~plan.valid[:, :, i0:i1], float("-inf"))
        s6 += pad[:, :, :, None, None, :, None]
    return torch.softmax(s, dim=-1), kg, vg, flat


def _causal_bias(block: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(block, block) additive bias: -inf where the key comes after the query inside the own block."""
    return torch.full((block, block), float("-inf"), dtype=dtype, device=device).triu_(1)


def _grouped(x: torch.Tensor, hkv: int, block: int) -> torch.Tensor:
    """(B, Hq, L, D) -> (B, Hkv, nQ, G, block, D) view-permutation (group heads next to their block)."""
    b, hq, length, d = x.shape
    return x.view(b, hkv, hq // hkv, length // block, block, d).permute(0, 1, 3, 2, 4, 5)


def _ungrouped(x: torch.Tensor) -> torch.Tensor:
    """(B, Hkv, nQ, G, block, D) -> (B, Hq, L, D)."""
    b, hkv, n_q, g, block, d = x.shape
    return x.permute(0, 1, 3, 2, 4, 5).reshape(b, hkv * g, n_q * block, d)


class SparseAttentionCPU(torch.autograd.Function):
    """Block-sparse causal attention over chosen key blocks; saves only q, k, v and the output."""

    @staticmethod
    def forward(ctx, q, k, v, indices, block_size: int, q_block_offset: int):  # type: ignore[override]
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        group, n_q, n_k = hq // hkv, lq // block_size, lk // block_size
        plan = BlockPlan(indices, n_k, q_block_offset)
        scale = 1.0 / math.sqrt(d)
        kb = k.contiguous().view(b * hkv * n_k, block_size, d)  # (B·Hkv·nK, block, D)
        vb = v.contiguous().view(b * hkv * n_k, block_size, d)  # (B·Hkv·nK, block, D)
        qg = _grouped(q, hkv, block_size)  # (B, Hkv, nQ, G, block, D)
        out = torch.empty(b, hkv, n_q, group, block_size, d, dtype=q.dtype, device=q.device)  # (B, Hkv, nQ, G, block, D)
        chunk = _chunk_size(b, hkv, group, block_size, plan.width + 1)
        tri = _causal_bias(block_size, q.dtype, q.device)  # (block, block)
        for i0 in range(0, n_q, chunk):
            i1 = min(n_q, i0 + chunk)
            c = i1 - i0
            qc = qg[:, :, i0:i1].reshape(b, hkv, c, group * block_size, d) * scale  # (B, Hkv, C, G·block, D)
            p, _, vg, _ = _probs(qc, kb, vb, plan, i0, i1, tri)
            out[:, :, i0:i1] = (p @ vg).view(b, hkv, c, group, block_size, d)
        out_q = _ungrouped(out)  # (B, Hq, L, D)
        ctx.save_for_backward(q, k, v, out_q)
        ctx.plan, ctx.block_size = plan, block_size
        ctx.mark_non_differentiable(indices)
        return out_q

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out = ctx.saved_tensors
        plan, block_size = ctx.plan, ctx.block_size
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        group, n_q, n_k = hq // hkv, lq // block_size, lk // block_size
        scale = 1.0 / math.sqrt(d)
        kb = k.contiguous().view(b * hkv * n_k, block_size, d)  # (B·Hkv·nK, block, D)
        vb = v.contiguous().view(b * hkv * n_k, block_size, d)  # (B·Hkv·nK, block, D)
        qg = _grouped(q, hkv, block_size)  # (B, Hkv, nQ, G, block, D)
        dog = _grouped(dout.contiguous(), hkv, block_size)  # (B, Hkv, nQ, G, block, D)
        delta = (dout.float() * out.float()).sum(-1)  # (B, Hq, L) = rowsum(dO · O)
        delta = delta.view(b, hkv, group, n_q, block_size).permute(0, 1, 3, 2, 4)  # (B, Hkv, nQ, G, block)
        acc = torch.float32  # dK, dV accumulate over many query blocks: keep them in fp32
        dkb = torch.zeros(b * hkv * n_k, block_size, d, dtype=acc, device=q.device)  # (B·Hkv·nK, block, D)
        dvb = torch.zeros(b * hkv * n_k, block_size, d, dtype=acc, device=q.device)  # (B·Hkv·nK, block, D)
        dq = torch.empty(b, hkv, n_q, group, block_size, d, dtype=q.dtype, device=q.device)  # (B, Hkv, nQ, G, block, D)
        chunk = _chunk_size(b, hkv, group, block_size, plan.width + 1)
        tri = _causal_bias(block_size, q.dtype, q.device)  # (block, block)
        for i0 in range(0, n_q, chunk):
            i1 = min(n_q, i0 + chunk)
            c = i1 - i0
            qc = qg[:, :, i0:i1].reshape(b, hkv, c, group * block_size, d) * scale  # (B, Hkv, C, G·block, D)
            doc = dog[:, :, i0:i1].reshape(b, hkv, c, group * block_size, d)  # (B, Hkv, C, G·block, D)
            p, kg, vg, flat = _probs(qc, kb, vb, plan, i0, i1, tri)
            dv_part = p.transpose(-1, -2) @ doc  # (B, Hkv, C, (W+1)·block, D), sums over the group's rows
            dp = doc @ vg.transpose(-1, -2)  # (B, Hkv, C, G·block, (W+1)·block)
            dlt = delta[:, :, i0:i1].reshape(b, hkv, c, group * block_size, 1)  # (B, Hkv, C, G·block, 1) fp32
            ds = torch.sub(dp, dlt).mul_(p).to(q.dtype)  # (B, Hkv, C, G·block, (W+1)·block), fp32 arithmetic
            dq[:, :, i0:i1] = ((ds @ kg) * scale).view(b, hkv, c, group, block_size, d)
            dk_part = ds.transpose(-1, -2) @ qc  # (B, Hkv, C, (W+1)·block, D); qc already carries the scale
            dkb.index_add_(0, flat, dk_part.reshape(-1, block_size, d).to(acc))
            dvb.index_add_(0, flat, dv_part.reshape(-1, block_size, d).to(acc))
        dk = dkb.view(b, hkv, lk, d).to(k.dtype)  # (B, Hkv, Lk, D)
        dv = dvb.view(b, hkv, lk, d).to(v.dtype)  # (B, Hkv, Lk, D)
        return _ungrouped(dq), dk, dv, None, None, None


def sparse_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Chunked block-sparse attention: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), indices (B, Hkv, nQ, budget)."""
    return SparseAttentionCPU.apply(q, k, v, indices, block_size, q_block_offset)
