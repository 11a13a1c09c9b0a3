"""Chunked block-sparse attention in PyTorch (custom autograd Function): the implementation that runs on CPU.

Forward walks the query blocks in small chunks (a few blocks, so each chunk's scores stay in cache), gathers the
selected K/V blocks, and keeps only the output; backward recomputes the probabilities per chunk (flash-attention
style; a chunk holds whole rows, so not even the log-sum-exp has to be kept). Memory is O(L · budget) for the
index plus O(chunk · budget · block²) scratch, never O(L²). Only the own (diagonal) block needs the causal mask:
every other chosen block lies wholly before it.

Parallelism: the many small per-chunk ops are run single-threaded, one worker thread per group of
(batch, KV head) rows (torch ops release the GIL). Intra-op threading of such small ops costs a fork/join per
op, which dominates when the cores are shared; separate heads also write disjoint dK/dV rows, so no locks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from lcft.kernels.sparse_blocks import (
    BlockLayout,
    BlockPlan,
    causal_bias,
    chunk_scores,
    chunk_size,
    grouped,
    run_over_heads,
    ungrouped,
)


def _probs(
    qc: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, plan: BlockPlan, rows: slice, i0: int, i1: int,
    tri: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention probabilities of one chunk, with its gathered keys, values and their flat ids.

    qc: (h, C, G·block, D) pre-scaled queries of B·Hkv rows `rows`; tri: (block, block) causal bias.
    A chunk holds whole rows (every chosen block of its queries), so softmax needs no running max: p is
    recomputed identically in backward. Scores stay in the input dtype (bf16 matmuls accumulate in fp32);
    torch.softmax computes in fp32 internally.
    Returns p (h, C, G·block, (W+1)·block), kg and vg (h, C, (W+1)·block, D), flat ids (h·C·(W+1),).
    """
    s, kg, vg, flat = chunk_scores(qc, kb, vb, plan.flat[rows, i0:i1], plan.valid[rows, i0:i1], tri,
                                   own_last=True, masked=any(plan.padded[i0:i1]), dtype=qc.dtype)
    return torch.softmax(s, dim=-1), kg, vg, flat


class SparseAttentionCPU(torch.autograd.Function):
    """Block-sparse causal attention over chosen key blocks; saves only q, k, v and the output."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, block_size: int, q_block_offset: int) -> torch.Tensor:  # type: ignore[override]
        lay = BlockLayout(q, k, block_size)
        b, hkv, d, group, n_q, n_k = lay.b, lay.hkv, lay.d, lay.group, lay.n_q, lay.n_k
        scale, kb, vb, qg = lay.scale, lay.blocks(k), lay.blocks(v), lay.qg
        plan = BlockPlan(indices, n_k, q_block_offset)
        out = torch.empty(b * hkv, n_q, group, block_size, d, dtype=q.dtype, device=q.device)  # (BH, nQ, G, block, D)
        chunk = chunk_size(group, block_size, plan.width + 1)
        tri = causal_bias(block_size, q.dtype, q.device)  # (block, block)

        def work(h0: int, h1: int) -> None:
            rows, h = slice(h0, h1), h1 - h0
            for i0 in range(0, n_q, chunk):
                i1 = min(n_q, i0 + chunk)
                qc = qg[rows, i0:i1].reshape(h, i1 - i0, group * block_size, d) * scale  # (h, C, G·block, D)
                p, _, vg, _ = _probs(qc, kb, vb, plan, rows, i0, i1, tri)
                out[rows, i0:i1] = (p @ vg).view(h, i1 - i0, group, block_size, d)

        run_over_heads(work, b * hkv)
        out_q = ungrouped(out, b)  # (B, Hq, L, D)
        ctx.save_for_backward(q, k, v, out_q)
        ctx.plan, ctx.block_size = plan, block_size
        ctx.mark_non_differentiable(indices)
        return out_q

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:  # type: ignore[override]
        q, k, v, out = ctx.saved_tensors
        plan, block_size = ctx.plan, ctx.block_size
        lay = BlockLayout(q, k, block_size)
        b, hkv, d, group, n_q, n_k = lay.b, lay.hkv, lay.d, lay.group, lay.n_q, lay.n_k
        scale, kb, vb, qg = lay.scale, lay.blocks(k), lay.blocks(v), lay.qg
        og = grouped(out, hkv, block_size)  # (BH, nQ, G, block, D)
        dog = grouped(dout.contiguous(), hkv, block_size)  # (BH, nQ, G, block, D)
        acc = torch.float32  # dK, dV accumulate over many query blocks: keep them in fp32
        dkb = torch.zeros(b * hkv * n_k, block_size, d, dtype=acc, device=q.device)  # (BH·nK, block, D)
        dvb = torch.zeros(b * hkv * n_k, block_size, d, dtype=acc, device=q.device)  # (BH·nK, block, D)
        dq = torch.empty(b * hkv, n_q, group, block_size, d, dtype=q.dtype, device=q.device)  # (BH, nQ, G, block, D)
        chunk = chunk_size(group, block_size, plan.width + 1)
        tri = causal_bias(block_size, q.dtype, q.device)  # (block, block)

        def work(h0: int, h1: int) -> None:
            rows, h = slice(h0, h1), h1 - h0
            for i0 in range(0, n_q, chunk):
                i1 = min(n_q, i0 + chunk)
                shape = (h, i1 - i0, group * block_size, d)
                qc = qg[rows, i0:i1].reshape(shape) * scale  # (h, C, G·block, D)
                doc = dog[rows, i0:i1].reshape(shape)  # (h, C, G·block, D)
                oc = og[rows, i0:i1].reshape(shape)  # (h, C, G·block, D)
                p, kg, vg, flat = _probs(qc, kb, vb, plan, rows, i0, i1, tri)
                dlt = (doc.float() * oc.float()).sum(-1, keepdim=True)  # (h, C, G·block, 1) rowsum(dO · O)
                dv_part = p.transpose(-1, -2) @ doc  # (h, C, (W+1)·block, D), sums over the group's rows
                dp = doc @ vg.transpose(-1, -2)  # (h, C, G·block, (W+1)·block)
                ds = torch.sub(dp, dlt).mul_(p).to(q.dtype)  # (h, C, G·block, (W+1)·block), fp32 arithmetic
                dq[rows, i0:i1] = ((ds @ kg) * scale).view(h, i1 - i0, group, block_size, d)
                dk_part = ds.transpose(-1, -2) @ qc  # (h, C, (W+1)·block, D); qc already carries the scale
                dkb.index_add_(0, flat, dk_part.reshape(-1, block_size, d).to(acc))
                dvb.index_add_(0, flat, dv_part.reshape(-1, block_size, d).to(acc))

        run_over_heads(work, b * hkv)  # heads own disjoint dK/dV rows, so workers never write the same row
        dk = dkb.view(k.shape).to(k.dtype)  # (B, Hkv, Lk, D)
        dv = dvb.view(v.shape).to(v.dtype)  # (B, Hkv, Lk, D)
        return ungrouped(dq, b), dk, dv, None, None, None


def sparse_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Chunked block-sparse attention: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), indices (B, Hkv, nQ, budget)."""
    return SparseAttentionCPU.apply(q, k, v, indices, block_size, q_block_offset)
