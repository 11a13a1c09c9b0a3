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

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.autograd.function import once_differentiable

# Scratch target per chunk and head (score entries): scores stay in the per-core cache.
_CHUNK_SCORE_ELEMS = 1 << 17


class BlockPlan:
    """Gather indices for one call: row r of each query block = its non-own chosen blocks, then its own block.

    `flat` indexes the (B·Hkv·nK, block, D) view of k and v; padding slots point at block 0 of their head and
    are masked to -inf, so their probabilities (and thus their gradient contributions) are exactly zero.
    """

    def __init__(self, indices: torch.Tensor, n_k: int, q_block_offset: int) -> None:
        b, hkv, n_q, s = indices.shape
        idx = indices.long().flatten(0, 1)  # (BH, nQ, S) with BH = B·Hkv
        own = torch.arange(q_block_offset, q_block_offset + n_q, device=idx.device)[:, None]  # (nQ, 1)
        others = torch.where(idx == own, -1, idx)  # (BH, nQ, S); exactly one own entry was removed
        others = others.sort(dim=-1, descending=True).values[..., : s - 1]  # (BH, nQ, W) valid first
        self.width = s - 1  # W: non-own slots per query block
        self.valid = others >= 0  # (BH, nQ, W)
        # Query blocks with padding slots (the first few, for selection output): only their chunks need masking.
        self.padded = (~self.valid).any(-1).any(0).tolist()  # nQ bools
        base = (torch.arange(b * hkv, device=idx.device) * n_k).view(-1, 1, 1)  # (BH, 1, 1)
        own_flat = base + own  # (BH, nQ, 1)
        self.flat = torch.cat([base + others.clamp(min=0), own_flat], dim=-1)  # (BH, nQ, W + 1)


def _run_over_heads(fn: Callable[[int, int], None], n_bh: int) -> None:
    """Call fn(h0, h1) on disjoint ranges of the B·Hkv rows, one single-threaded worker per range."""
    workers = min(torch.get_num_threads(), n_bh)
    if workers <= 1:
        fn(0, n_bh)
        return
    bounds = [n_bh * i // workers for i in range(workers + 1)]
    threads = torch.get_num_threads()

    def single_threaded(h0: int, h1: int) -> None:
        torch.set_num_threads(1)  # OpenMP's thread count is per calling thread: set it in the worker itself
        with torch.no_grad():  # grad mode is thread-local: without this, workers would record autograd graphs
            fn(h0, h1)

    try:
        with ThreadPoolExecutor(workers) as pool:
            for fut in [pool.submit(single_threaded, h0, h1) for h0, h1 in zip(bounds, bounds[1:], strict=False)]:
                fut.result()
    finally:
        torch.set_num_threads(threads)


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
    h, c, m, d = qc.shape
    block, w = tri.shape[0], plan.width
    flat = plan.flat[rows, i0:i1].reshape(-1)  # (h·C·(W+1),)
    kg = kb.index_select(0, flat).view(h, c, (w + 1) * block, d)  # (h, C, (W+1)·block, D)
    vg = vb.index_select(0, flat).view(h, c, (w + 1) * block, d)  # (h, C, (W+1)·block, D)
    s = qc @ kg.transpose(-1, -2)  # (h, C, G·block, (W+1)·block)
    s6 = s.view(h, c, m // block, block, w + 1, block)
    s6[..., w, :] += tri
    if any(plan.padded[i0:i1]):
        pad = torch.zeros(h, c, w + 1, dtype=s.dtype, device=s.device)  # (h, C, W+1)
        pad[..., :w].masked_fill_(~plan.valid[rows, i0:i1], float("-inf"))
        s6 += pad[:, :, None, None, :, None]
    return torch.softmax(s, dim=-1), kg, vg, flat


def _causal_bias(block: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(block, block) additive bias: -inf where the key comes after the query inside the own block."""
    return torch.full((block, block), float("-inf"), dtype=dtype, device=device).triu_(1)


def _grouped(x: torch.Tensor, hkv: int, block: int) -> torch.Tensor:
    """(B, Hq, L, D) -> (B·Hkv, nQ, G, block, D) view (the group's heads next to their query block)."""
    b, hq, length, d = x.shape
    return x.view(b, hkv, hq // hkv, length // block, block, d).permute(0, 1, 3, 2, 4, 5).flatten(0, 1)


def _ungrouped(x: torch.Tensor, b: int) -> torch.Tensor:
    """(B·Hkv, nQ, G, block, D) -> (B, Hq, L, D)."""
    bh, n_q, g, block, d = x.shape
    return x.view(b, bh // b, n_q, g, block, d).permute(0, 1, 3, 2, 4, 5).reshape(b, bh // b * g, n_q * block, d)


class _Layout:
    """What forward and backward both derive from q, k, v: sizes, the key/value blocks and grouped queries."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> None:
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        self.b, self.hkv, self.d = b, hkv, d
        self.group, self.n_q, self.n_k = hq // hkv, lq // block_size, lk // block_size
        self.scale = 1.0 / math.sqrt(d)
        self.kb = k.contiguous().view(b * hkv * self.n_k, block_size, d)  # (BH·nK, block, D)
        self.vb = v.contiguous().view(b * hkv * self.n_k, block_size, d)  # (BH·nK, block, D)
        self.qg = _grouped(q, hkv, block_size)  # (BH, nQ, G, block, D)


class SparseAttentionCPU(torch.autograd.Function):
    """Block-sparse causal attention over chosen key blocks; saves only q, k, v and the output."""

    @staticmethod
    def forward(ctx, q, k, v, indices, block_size: int, q_block_offset: int):  # type: ignore[override]
        lay = _Layout(q, k, v, block_size)
        b, hkv, d, group, n_q, n_k = lay.b, lay.hkv, lay.d, lay.group, lay.n_q, lay.n_k
        scale, kb, vb, qg = lay.scale, lay.kb, lay.vb, lay.qg
        plan = BlockPlan(indices, n_k, q_block_offset)
        out = torch.empty(b * hkv, n_q, group, block_size, d, dtype=q.dtype, device=q.device)  # (BH, nQ, G, block, D)
        chunk = _chunk_size(group, block_size, plan.width + 1)
        tri = _causal_bias(block_size, q.dtype, q.device)  # (block, block)

        def work(h0: int, h1: int) -> None:
            rows, h = slice(h0, h1), h1 - h0
            for i0 in range(0, n_q, chunk):
                i1 = min(n_q, i0 + chunk)
                qc = qg[rows, i0:i1].reshape(h, i1 - i0, group * block_size, d) * scale  # (h, C, G·block, D)
                p, _, vg, _ = _probs(qc, kb, vb, plan, rows, i0, i1, tri)
                out[rows, i0:i1] = (p @ vg).view(h, i1 - i0, group, block_size, d)

        _run_over_heads(work, b * hkv)
        out_q = _ungrouped(out, b)  # (B, Hq, L, D)
        ctx.save_for_backward(q, k, v, out_q)
        ctx.plan, ctx.block_size = plan, block_size
        ctx.mark_non_differentiable(indices)
        return out_q

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out = ctx.saved_tensors
        plan, block_size = ctx.plan, ctx.block_size
        lay = _Layout(q, k, v, block_size)
        b, hkv, d, group, n_q, n_k = lay.b, lay.hkv, lay.d, lay.group, lay.n_q, lay.n_k
        scale, kb, vb, qg = lay.scale, lay.kb, lay.vb, lay.qg
        og = _grouped(out, hkv, block_size)  # (BH, nQ, G, block, D)
        dog = _grouped(dout.contiguous(), hkv, block_size)  # (BH, nQ, G, block, D)
        acc = torch.float32  # dK, dV accumulate over many query blocks: keep them in fp32
        dkb = torch.zeros(b * hkv * n_k, block_size, d, dtype=acc, device=q.device)  # (BH·nK, block, D)
        dvb = torch.zeros(b * hkv * n_k, block_size, d, dtype=acc, device=q.device)  # (BH·nK, block, D)
        dq = torch.empty(b * hkv, n_q, group, block_size, d, dtype=q.dtype, device=q.device)  # (BH, nQ, G, block, D)
        chunk = _chunk_size(group, block_size, plan.width + 1)
        tri = _causal_bias(block_size, q.dtype, q.device)  # (block, block)

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

        _run_over_heads(work, b * hkv)  # heads own disjoint dK/dV rows, so workers never write the same row
        dk = dkb.view(k.shape).to(k.dtype)  # (B, Hkv, Lk, D)
        dv = dvb.view(v.shape).to(v.dtype)  # (B, Hkv, Lk, D)
        return _ungrouped(dq, b), dk, dv, None, None, None


def _chunk_size(group: int, block: int, slots: int) -> int:
    """Query blocks per chunk, so one head's scores take about _CHUNK_SCORE_ELEMS entries."""
    return max(1, _CHUNK_SCORE_ELEMS // (group * block * slots * block))


def sparse_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Chunked block-sparse attention: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), indices (B, Hkv, nQ, budget)."""
    return SparseAttentionCPU.apply(q, k, v, indices, block_size, q_block_offset)
