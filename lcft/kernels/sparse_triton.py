"""Triton block-sparse attention launcher: fused forward (online softmax), dQ per query tile, dK/dV per key tile.

Group-centric: the query heads of one KV group share their block selection, so every program covers a tile of
rows taken from all heads of the group (GP heads x M tokens of one query block) and loads each chosen K/V tile
once for all of them. Tile sizes come from `lcft.kernels.triton_tiles` per (GPU arch, dtype, head_dim).
dK/dV walk a transposed (CSR) index of which query blocks chose each key block, so no atomics are needed. A
key block chosen by very many query blocks (a sink block is chosen by all) is split into segments of at most
`_SEG` entries whose fp32 partial sums are added afterwards in a fixed order and rounded once, so one program does
not serialise the backward.
All offsets are int64 (1M tokens x heads x head_dim overflows int32). `triton` is imported inside functions.
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from lcft.kernels.sparse_blocks import output_delta
from lcft.kernels.triton_tiles import TileConfig, on_device, tile_config

_SEG = 64  # max (query block) entries per dK/dV program


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    """The jitted kernels; their module imports triton, so it is imported on first use only."""
    from lcft.kernels.sparse_triton_kernels import dkv_kernel, dq_kernel, fwd_kernel

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
        rows, per_row = torch.unique_consecutive(seg_row[multi], return_counts=True)  # a split row's slots are adjacent
        first = torch.cumsum(per_row, 0) - per_row  # (nSplit,) each split row's first slot
        order = torch.sort(per_row, descending=True, stable=True).indices  # rows with more slots first
        self.split_rows, self.split_first = rows[order], first[order]  # (nSplit,)
        counts = sorted(per_row.tolist())
        # how many split rows have a slot j, for j = 1, 2, ...: a prefix, as the rows are sorted by their slots
        self.split_prefix = [len(counts) - bisect.bisect_right(counts, j) for j in range(1, counts[-1])] if counts else []

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """(nPartial, block, D) fp32 partial sums -> (nSplit, block, D) the sum of each split row's, in fp32 and
        in slot order (deterministic: no atomics, unlike index_add_ on CUDA)."""
        acc = partial[self.split_first].clone()  # (nSplit, block, D)
        for j, n in enumerate(self.split_prefix, start=1):
            acc[:n] += partial[self.split_first[:n] + j]
        return acc


def _tiles(q: torch.Tensor, group: int, block_size: int) -> TileConfig:
    """The tile configuration for this device (the interpreter takes the sm_90 one)."""
    cap = torch.cuda.get_device_capability(q.device) if q.is_cuda else (9, 0)
    return tile_config(cap, q.dtype, q.shape[-1], block_size, group)


class SparseAttentionTriton(torch.autograd.Function):
    """Fused Triton block-sparse attention; saves q, k, v, out and the fp32 log-sum-exp."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, block_size: int, q_block_offset: int) -> torch.Tensor:  # type: ignore[override]
        with on_device(q):
            return SparseAttentionTriton._forward(ctx, q, k, v, indices, block_size, q_block_offset)

    @staticmethod
    def _forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, block_size: int, q_block_offset: int) -> torch.Tensor:
        fwd_kernel, _, _ = _kernels()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        indices = indices.to(torch.int32).contiguous()
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        t = _tiles(q, hq // hkv, block_size)
        out = torch.empty_like(q)  # (B, Hq, Lq, D)
        lse = torch.empty(b, hq, lq, dtype=torch.float32, device=q.device)  # (B, Hq, Lq)
        fwd_kernel[(lq // t.m, b * hkv)](
            q, k, v, out, lse, indices, hq, hq // hkv, lq, lk, indices.shape[-1], q_block_offset,
            1.0 / math.sqrt(d), **t.fwd_consts())
        ctx.save_for_backward(q, k, v, out, lse, indices)
        ctx.block_size, ctx.q_block_offset = block_size, q_block_offset
        ctx.mark_non_differentiable(indices)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:  # type: ignore[override]
        with on_device(dout):
            return SparseAttentionTriton._backward(ctx, dout)

    @staticmethod
    def _backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        _, dq_kernel, dkv_kernel = _kernels()
        q, k, v, out, lse, indices = ctx.saved_tensors
        block_size, offset = ctx.block_size, ctx.q_block_offset
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        n_k = lk // block_size
        t = _tiles(q, hq // hkv, block_size)
        dout = dout.contiguous()
        delta = output_delta(dout, out)  # (B, Hq, Lq) rowsum(dO · O)
        scale = 1.0 / math.sqrt(d)
        dq = torch.empty_like(q)
        dq_kernel[(lq // t.dq_m, b * hkv)](
            q, k, v, dout, dq, lse, delta, indices, hq, hq // hkv, lq, lk, indices.shape[-1], offset, scale,
            **t.dq_consts())
        tix = TransposedIndex(indices, n_k)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # key blocks nobody chose keep zero gradient
        pk = torch.empty(max(1, tix.n_partial), block_size, d, dtype=torch.float32, device=q.device)
        pv = torch.empty_like(pk)
        if tix.seg_row.numel():
            dkv_kernel[(tix.seg_row.numel() * (block_size // t.kn),)](
                q, k, v, dout, dk, dv, pk, pv, lse, delta, tix.seg_row, tix.seg_start, tix.seg_end, tix.seg_out,
                tix.col, hq, hq // hkv, lq, lk, n_k, offset, scale, **t.dkv_consts())
        if tix.n_partial:  # a split row's segments all went to partial slots: its sum, rounded once, is its gradient
            dk.view(-1, block_size, d).index_copy_(0, tix.split_rows, tix.reduce(pk).to(k.dtype))
            dv.view(-1, block_size, d).index_copy_(0, tix.split_rows, tix.reduce(pv).to(v.dtype))
        return dq, dk, dv, None, None, None


def sparse_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
    q_block_offset: int = 0,
) -> torch.Tensor:
    """Triton block-sparse attention: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), indices (B, Hkv, nQ, budget)."""
    return SparseAttentionTriton.apply(q, k, v, indices, block_size, q_block_offset)
