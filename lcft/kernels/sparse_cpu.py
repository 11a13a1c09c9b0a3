"""Chunked block-sparse attention in PyTorch (custom autograd Function): the implementation that runs on CPU.

Forward walks the query blocks in small chunks (a few blocks, so each chunk's scores stay in cache), gathers the
selected K/V blocks, and keeps only the output and the log-sum-exp; backward recomputes the scores per chunk
(flash-attention style). Memory is O(L · budget · block) for indices plus O(chunk · budget · block²) scratch,
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
        self.any_invalid = bool((~self.valid).any())
        base = (torch.arange(b * hkv, device=idx.device) * n_k).view(b, hkv, 1, 1)  # (B, Hkv, 1, 1)
        own_flat = base + own.expand(n_q, 1)  # (B, Hkv, nQ, 1)
        self.flat = torch.cat([base + others.clamp(min=0), own_flat], dim=-1)  # (B, Hkv, nQ, W + 1)


def _chunk_size(b: int, hkv: int, group: int, block: int, slots: int) -> int:
    per_block = b * hkv * group * block * slots * block  # score entries of one query block
    return max(1, _CHUNK_SCORE_ELEMS // per_block)


def _scores(
    qc: torch.Tensor, kb: torch.Tensor, plan: BlockPlan, i0: int, i1: int, group: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked fp32 scores of one chunk and its gathered keys' flat ids.

    qc: (B, Hkv, C, G·block, D) pre-scaled queries. Returns s (B, Hkv, C, G·block, (W+1)·block), flat (B, Hkv, C, W+1).
    """
    b, hkv, c, _, d = qc.shape
    w = plan.width
    flat = plan.flat[:, :, i0:i1]  # (B, Hkv, C, W+1)
    kg = kb[flat].view(b, hkv, c, (w + 1) * block, d)  # (B, Hkv, C, (W+1)·block, D)
    s = (qc @ kg.transpose(-1, -2)).float()  # (B, Hkv, C, G·block, (W+1)·block)
    s6 = s.view(b, hkv, c, group, block, w + 1, block)
    tri = torch.full((block, block), float("-inf"), device=s.device).triu_(1)  # (block, block) causal inside the own block
    s6[..., w, :] += tri
    if plan.any_invalid:
        pad = torch.zeros(b, hkv, c, w + 1, device=s.device)  # (B, Hkv, C, W+1)
        pad[..., :w].masked_fill_(~plan.valid[:, :, i0:i1], float("-inf"))
        s6 += pad[:, :, :, None, None, :, None]
    return s, flat


def _grouped(x: torch.Tensor, hkv: int, block: int) -> torch.Tensor:
    """(B, Hq, L, D) -> (B, Hkv, nQ, G, block, D) view-permutation (group heads next to their block)."""
    b, hq, length, d = x.shape
    return x.view(b, hkv, hq // hkv, length // block, block, d).permute(0, 1, 3, 2, 4, 5)


def _ungrouped(x: torch.Tensor) -> torch.Tensor:
    """(B, Hkv, nQ, G, block, D) -> (B, Hq, L, D)."""
    b, hkv, n_q, g, block, d = x.shape
    return x.permute(0, 1, 3, 2, 4, 5).reshape(b, hkv * g, n_q * block, d)


class SparseAttentionCPU(torch.autograd.Function):
    """Block-sparse causal attention over chosen key blocks; saves q, k, v, out and lse only."""

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
        lse = torch.empty(b, hkv, n_q, group * block_size, dtype=torch.float32, device=q.device)  # (B, Hkv, nQ, G·block)
        w1 = plan.width + 1
        chunk = _chunk_size(b, hkv, group, block_size, w1)
        for i0 in range(0, n_q, chunk):
            i1 = min(n_q, i0 + chunk)
            c = i1 - i0
            qc = qg[:, :, i0:i1].reshape(b, hkv, c, group * block_size, d) * scale  # (B, Hkv, C, G·block, D)
            s, flat = _scores(qc, kb, plan, i0, i1, group, block_size)
            m = s.amax(dim=-1, keepdim=True)  # (B, Hkv, C, G·block, 1)
            p = s.sub_(m).exp_()  # (B, Hkv, C, G·block, (W+1)·block), in place of s
            den = p.sum(dim=-1, keepdim=True)  # (B, Hkv, C, G·block, 1)
            vg = vb[flat].view(b, hkv, c, w1 * block_size, d)  # (B, Hkv, C, (W+1)·block, D)
            o = (p.to(q.dtype) @ vg).float() / den  # (B, Hkv, C, G·block, D)
            out[:, :, i0:i1] = o.view(b, hkv, c, group, block_size, d).to(q.dtype)
            lse[:, :, i0:i1] = (m + den.log()).squeeze(-1)
        out_q = _ungrouped(out)  # (B, Hq, L, D)
        ctx.save_for_backward(q, k, v, out_q, lse)
        ctx.plan, ctx.block_size = plan, block_size
        ctx.mark_non_differentiable(indices)
        return out_q

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        plan, block_size = ctx.plan, ctx.block_size
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        group, n_q, n_k = hq // hkv, lq // block_size, lk // block_size
        scale = 1.0 / math.sqrt(d)
        w1 = plan.width + 1
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
        chunk = _chunk_size(b, hkv, group, block_size, w1)
        for i0 in range(0, n_q, chunk):
            i1 = min(n_q, i0 + chunk)
            c = i1 - i0
            qc = qg[:, :, i0:i1].reshape(b, hkv, c, group * block_size, d) * scale  # (B, Hkv, C, G·block, D)
            doc = dog[:, :, i0:i1].reshape(b, hkv, c, group * block_size, d)  # (B, Hkv, C, G·block, D)
            s, flat = _scores(qc, kb, plan, i0, i1, group, block_size)
            p = s.sub_(lse[:, :, i0:i1, :, None]).exp_()  # (B, Hkv, C, G·block, (W+1)·block)
            kg = kb[flat].view(b, hkv, c, w1 * block_size, d)  # (B, Hkv, C, (W+1)·block, D)
            vg = vb[flat].view(b, hkv, c, w1 * block_size, d)  # (B, Hkv, C, (W+1)·block, D)
            pc = p.to(q.dtype)
            dv_part = pc.transpose(-1, -2) @ doc  # (B, Hkv, C, (W+1)·block, D), sums over the group's rows
            dp = (doc @ vg.transpose(-1, -2)).float()  # (B, Hkv, C, G·block, (W+1)·block)
            dlt = delta[:, :, i0:i1].reshape(b, hkv, c, group * block_size, 1)  # (B, Hkv, C, G·block, 1)
            ds = dp.sub_(dlt).mul_(p).to(q.dtype)  # (B, Hkv, C, G·block, (W+1)·block)
            dq[:, :, i0:i1] = ((ds @ kg).float() * scale).view(b, hkv, c, group, block_size, d).to(q.dtype)
            dk_part = ds.transpose(-1, -2) @ qc  # (B, Hkv, C, (W+1)·block, D); qc already carries the scale
            rows = flat.reshape(-1)  # (B·Hkv·C·(W+1),)
            dkb.index_add_(0, rows, dk_part.reshape(-1, block_size, d).to(acc))
            dvb.index_add_(0, rows, dv_part.reshape(-1, block_size, d).to(acc))
        dk = dkb.view(b, hkv, lk, d).to(k.dtype)  # (B, Hkv, Lk, D)
        dv = dvb.view(b, hkv, lk, d).to(v.dtype)  # (B, Hkv, Lk, D)
        return _ungrouped(dq), dk, dv, None, None, None


def sparse_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Chunked block-sparse attention: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), indices (B, Hkv, nQ, budget)."""
    return SparseAttentionCPU.apply(q, k, v, indices, block_size, q_block_offset)
