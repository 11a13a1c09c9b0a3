"""Triton block-sparse attention: fused forward (online softmax), dQ per query block, dK/dV per key block.

dK/dV walk a transposed (CSR) index of which query blocks chose each key block, so no atomics are needed. A
key block chosen by very many query blocks (a sink block is chosen by all) is split into segments of at most
`_SEG` entries whose partial sums are added afterwards, so one program does not serialise the backward.
All offsets are int64 (1M tokens x heads x head_dim overflows int32). `triton` is imported inside functions.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.autograd.function import once_differentiable

_SEG = 64  # max (query block) entries per dK/dV program


@functools.cache
def _kernels():
    """Compile-on-first-use kernel definitions (keeps `import triton` out of module import)."""
    import triton
    import triton.language as tl

    @triton.jit
    def fwd_kernel(Q, K, V, Out, LSE, IDX, n_heads, group, lq, lk, n_slots, q_block_offset, scale,
                   BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                   PREC: tl.constexpr):
        qb = tl.program_id(0).to(tl.int64)
        bh = tl.program_id(1).to(tl.int64)
        bkv = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group  # flat (b, kv head)
        offs_m = tl.arange(0, BLOCK)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BD)
        dmask = offs_d[None, :] < D
        q_rows = bh * lq + qb * BLOCK + offs_m  # (BLOCK,) int64 row ids into (B·Hq·Lq, D)
        q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=dmask, other=0.0)
        q_pos = (q_block_offset + qb) * BLOCK + offs_m  # global positions
        m_i = tl.full((BLOCK,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK,), tl.float32)
        acc = tl.zeros((BLOCK, BD), tl.float32)
        idx_row = IDX + (bkv * (lq // BLOCK) + qb) * n_slots
        for slot in range(n_slots):
            kb = tl.load(idx_row + slot).to(tl.int64)
            if kb >= 0:
                for sub in tl.static_range(BLOCK // BLOCK_N):
                    k_pos = kb * BLOCK + sub * BLOCK_N + offs_n  # (BLOCK_N,)
                    kv_off = (bkv * lk + k_pos)[:, None] * D + offs_d[None, :]
                    k = tl.load(K + kv_off, mask=dmask, other=0.0)
                    v = tl.load(V + kv_off, mask=dmask, other=0.0)
                    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # (BLOCK, BLOCK_N)
                    s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(s, 1))
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
                    alpha = tl.exp(m_i - m_safe)
                    p = tl.exp(s - m_safe[:, None])
                    l_i = l_i * alpha + tl.sum(p, 1)
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
                    m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(Out + q_rows[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=dmask)
        tl.store(LSE + q_rows, m_i + tl.log(l_i))

    @triton.jit
    def dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, IDX, n_heads, group, lq, lk, n_slots, q_block_offset, scale,
                  BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                  PREC: tl.constexpr):
        qb = tl.program_id(0).to(tl.int64)
        bh = tl.program_id(1).to(tl.int64)
        bkv = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
        offs_m = tl.arange(0, BLOCK)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BD)
        dmask = offs_d[None, :] < D
        q_rows = bh * lq + qb * BLOCK + offs_m
        q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=dmask, other=0.0)
        do = tl.load(DO + q_rows[:, None] * D + offs_d[None, :], mask=dmask, other=0.0)
        lse = tl.load(LSE + q_rows)
        delta = tl.load(DELTA + q_rows)
        q_pos = (q_block_offset + qb) * BLOCK + offs_m
        dq = tl.zeros((BLOCK, BD), tl.float32)
        idx_row = IDX + (bkv * (lq // BLOCK) + qb) * n_slots
        for slot in range(n_slots):
            kb = tl.load(idx_row + slot).to(tl.int64)
            if kb >= 0:
                for sub in tl.static_range(BLOCK // BLOCK_N):
                    k_pos = kb * BLOCK + sub * BLOCK_N + offs_n
                    kv_off = (bkv * lk + k_pos)[:, None] * D + offs_d[None, :]
                    k = tl.load(K + kv_off, mask=dmask, other=0.0)
                    v = tl.load(V + kv_off, mask=dmask, other=0.0)
                    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
                    p = tl.where(k_pos[None, :] <= q_pos[:, None], tl.exp(s - lse[:, None]), 0.0)
                    dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # (BLOCK, BLOCK_N)
                    ds = p * (dp - delta[:, None])
                    dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
        tl.store(DQ + q_rows[:, None] * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=dmask)

    @triton.jit
    def dkv_kernel(Q, K, V, DO, DK, DV, PK, PV, LSE, DELTA, SEG_ROW, SEG_START, SEG_END, SEG_OUT, COL,
                   n_heads, group, lq, lk, n_kb, q_block_offset, scale,
                   BLOCK: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
        seg = tl.program_id(0)
        row = tl.load(SEG_ROW + seg).to(tl.int64)  # flat (b, kv head, key block)
        start = tl.load(SEG_START + seg)
        end = tl.load(SEG_END + seg)
        out_slot = tl.load(SEG_OUT + seg).to(tl.int64)  # -1: write dK/dV directly; else a partial-sum slot
        bkv = row // n_kb
        kb = row % n_kb
        n_kv = n_heads // group
        b = bkv // n_kv
        hk = bkv % n_kv
        offs_m = tl.arange(0, BLOCK)
        offs_d = tl.arange(0, BD)
        dmask = offs_d[None, :] < D
        k_pos = kb * BLOCK + offs_m  # (BLOCK,) keys of this program
        kv_off = (bkv * lk + k_pos)[:, None] * D + offs_d[None, :]
        k = tl.load(K + kv_off, mask=dmask, other=0.0)
        v = tl.load(V + kv_off, mask=dmask, other=0.0)
        dk = tl.zeros((BLOCK, BD), tl.float32)
        dv = tl.zeros((BLOCK, BD), tl.float32)
        for e in range(start, end):
            qb = tl.load(COL + e).to(tl.int64)  # a query block (local id) that chose this key block
            q_pos = (q_block_offset + qb) * BLOCK + offs_m
            for g in range(group):
                bh = b * n_heads + hk * group + g
                q_rows = bh * lq + qb * BLOCK + offs_m
                q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=dmask, other=0.0)
                do = tl.load(DO + q_rows[:, None] * D + offs_d[None, :], mask=dmask, other=0.0)
                lse = tl.load(LSE + q_rows)
                delta = tl.load(DELTA + q_rows)
                st = tl.dot(k, tl.trans(q), input_precision=PREC) * scale  # (keys, queries)
                pt = tl.where(k_pos[:, None] <= q_pos[None, :], tl.exp(st - lse[None, :]), 0.0)
                dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
                dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
                dst = pt * (dpt - delta[None, :])
                dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
        dk = dk * scale
        if out_slot < 0:
            tl.store(DK + kv_off, dk.to(DK.dtype.element_ty), mask=dmask)
            tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=dmask)
        else:
            p_off = (out_slot * BLOCK + offs_m)[:, None] * D + offs_d[None, :]
            tl.store(PK + p_off, dk, mask=dmask)
            tl.store(PV + p_off, dv, mask=dmask)

    return fwd_kernel, dq_kernel, dkv_kernel


class TransposedIndex:
    """CSR of (b, kv head, key block) -> query blocks that chose it, cut into segments of <= _SEG entries."""

    def __init__(self, indices: torch.Tensor, n_k: int) -> None:
        b, hkv, n_q, s = indices.shape
        dev = indices.device
        idx = indices.long()  # (B, Hkv, nQ, S)
        valid = idx >= 0
        rows = (torch.arange(b * hkv, device=dev).view(b, hkv, 1, 1) * n_k + idx)[valid]  # (E,)
        qids = torch.arange(n_q, device=dev).view(1, 1, n_q, 1).expand_as(idx)[valid]  # (E,)
        order = torch.sort(rows, stable=True).indices
        self.col = qids[order].to(torch.int32).contiguous()  # (E,) query blocks grouped by key block
        counts = torch.bincount(rows, minlength=b * hkv * n_k)  # (B·Hkv·nK,)
        row_ptr = torch.cumsum(counts, 0) - counts  # (B·Hkv·nK,) first entry of each row
        n_seg = (counts + _SEG - 1) // _SEG  # 0 for unchosen key blocks: their dK/dV stay zero
        seg_row = torch.repeat_interleave(torch.arange(b * hkv * n_k, device=dev), n_seg)  # (nSeg,)
        first_seg = torch.cumsum(n_seg, 0) - n_seg
        seg_in_row = torch.arange(seg_row.numel(), device=dev) - first_seg[seg_row]  # (nSeg,)
        start = row_ptr[seg_row] + seg_in_row * _SEG
        end = torch.minimum(start + _SEG, row_ptr[seg_row] + counts[seg_row])
        multi = n_seg[seg_row] > 1  # rows split over several programs write partial sums
        slot = torch.where(multi, torch.cumsum(multi.long(), 0) - 1, -1)
        self.seg_row, self.seg_start, self.seg_end = seg_row.int(), start.int(), end.int()
        self.seg_out = slot.int()
        self.n_partial = int(multi.sum())
        self.partial_rows = seg_row[multi]  # (nPartial,) which key block each partial sum belongs to


class SparseAttentionTriton(torch.autograd.Function):
    """Fused Triton block-sparse attention; saves q, k, v, out and the fp32 log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, indices, block_size: int, q_block_offset: int):  # type: ignore[override]
        fwd_kernel, _, _ = _kernels()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        indices = indices.to(torch.int32).contiguous()
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        out = torch.empty_like(q)  # (B, Hq, Lq, D)
        lse = torch.empty(b, hq, lq, dtype=torch.float32, device=q.device)  # (B, Hq, Lq)
        fwd_kernel[(lq // block_size, b * hq)](
            q, k, v, out, lse, indices, hq, hq // hkv, lq, lk, indices.shape[-1], q_block_offset,
            1.0 / math.sqrt(d), **_consts(block_size, d, q.dtype))
        ctx.save_for_backward(q, k, v, out, lse, indices)
        ctx.block_size, ctx.q_block_offset = block_size, q_block_offset
        ctx.mark_non_differentiable(indices)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):  # type: ignore[override]
        _, dq_kernel, dkv_kernel = _kernels()
        q, k, v, out, lse, indices = ctx.saved_tensors
        block_size, offset = ctx.block_size, ctx.q_block_offset
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        n_k = lk // block_size
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1)  # (B, Hq, Lq) rowsum(dO · O)
        consts = _consts(block_size, d, q.dtype)
        scale = 1.0 / math.sqrt(d)
        dq = torch.empty_like(q)
        dq_kernel[(lq // block_size, b * hq)](
            q, k, v, dout, dq, lse, delta, indices, hq, hq // hkv, lq, lk, indices.shape[-1], offset, scale,
            **consts)
        tix = TransposedIndex(indices, n_k)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # key blocks nobody chose keep zero gradient
        pk = torch.empty(max(1, tix.n_partial), block_size, d, dtype=torch.float32, device=q.device)
        pv = torch.empty_like(pk)
        if tix.seg_row.numel():
            dkv_kernel[(tix.seg_row.numel(),)](
                q, k, v, dout, dk, dv, pk, pv, lse, delta, tix.seg_row, tix.seg_start, tix.seg_end, tix.seg_out,
                tix.col, hq, hq // hkv, lq, lk, n_k, offset, scale,
                BLOCK=block_size, D=d, BD=consts["BD"], PREC=consts["PREC"], num_warps=consts["num_warps"])
        if tix.n_partial:
            rows = tix.partial_rows  # sum the split rows' partial results (deterministic, on few blocks)
            dk.view(-1, block_size, d).index_add_(0, rows, pk.to(k.dtype))
            dv.view(-1, block_size, d).index_add_(0, rows, pv.to(v.dtype))
        return dq, dk, dv, None, None, None


def _consts(block_size: int, d: int, dtype: torch.dtype) -> dict:
    import triton

    bd = max(16, triton.next_power_of_2(d))
    return {"BLOCK": block_size, "BLOCK_N": min(block_size, 64), "D": d, "BD": bd,
            "PREC": "ieee" if dtype == torch.float32 else "tf32",  # fp32 stays exact (no TF32 rounding)
            "num_warps": 4 if block_size * bd <= 64 * 64 else 8}  # 128x128 fp32 accumulators need 8 warps


def sparse_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Triton block-sparse attention: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), indices (B, Hkv, nQ, budget)."""
    return SparseAttentionTriton.apply(q, k, v, indices, block_size, q_block_offset)
