"""Triton block selection: tiled scores with a running top-k per query block (never the full score matrix).

Each program takes QT query blocks of one (batch, KV head) and walks the earlier key blocks in tiles of T,
computing scores (group-summed query-block means · key-block summaries) and merging them into a per-row
top-k buffer held in registers: `top_k` rounds per tile of "take the row's best (value, lowest id) and
replace the buffer's worst (value, highest id) if better". Ties therefore go to the lower block id, exactly
as in the PyTorch selection. Mandatory blocks are merged afterwards by `assemble_indices`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from lcft.kernels.selection import assemble_indices, group_query_sums
from lcft.kernels.spec import SparseSpec
from lcft.kernels.triton_tiles import on_device

_QT, _T = 16, 64  # query blocks per program, key blocks per tile


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def topk_kernel(QS, KS, OUT, n_q, n_k, q_block_offset, local_blocks, sink_blocks,  # noqa: ANN001, ANN202 (Triton types them)
                    TOPK: tl.constexpr, KP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                    QT: tl.constexpr, T: tl.constexpr):
        pid_q = tl.program_id(0)
        bkv = tl.program_id(1).to(tl.int64)
        offs_q = pid_q * QT + tl.arange(0, QT)  # local query-block ids
        offs_d = tl.arange(0, BD)
        cols = tl.arange(0, KP)
        qmask = offs_q < n_q
        qs = tl.load(QS + (bkv * n_q + offs_q)[:, None] * D + offs_d[None, :],
                     mask=qmask[:, None] & (offs_d[None, :] < D), other=0.0)  # (QT, BD)
        own = q_block_offset + offs_q  # (QT,) global ids
        big = n_k + cols  # distinct fillers, so a buffer's worst entry is unique
        bv = tl.where(cols[None, :] < TOPK, float("-inf"), float("inf")) + tl.zeros((QT, KP), tl.float32)
        bi = big[None, :] + tl.zeros((QT, KP), tl.int32)
        last_own = q_block_offset + tl.minimum(pid_q * QT + QT, n_q) - 1
        hi = tl.minimum(last_own - local_blocks, n_k)  # candidates are < own - local
        for t0 in range(0, hi, T):
            kid = t0 + tl.arange(0, T)  # (T,)
            ks = tl.load(KS + (bkv * n_k + kid)[:, None] * D + offs_d[None, :],
                         mask=(kid[:, None] < n_k) & (offs_d[None, :] < D), other=0.0)  # (T, BD)
            s = tl.dot(qs, tl.trans(ks), input_precision="ieee")  # (QT, T)
            cand = (kid[None, :] < own[:, None] - local_blocks) & (kid[None, :] >= sink_blocks) & qmask[:, None]
            s = tl.where(cand, s, float("-inf"))
            for _ in tl.static_range(TOPK):
                m = tl.max(s, 1)  # (QT,) best remaining score of the tile
                am = tl.min(tl.where(s == m[:, None], kid[None, :], 2147483647), 1)  # its lowest id
                wv = tl.min(bv, 1)  # buffer's worst value ...
                wi = tl.max(tl.where(bv == wv[:, None], bi, -1), 1)  # ... and, among equals, highest id
                better = (m > float("-inf")) & ((m > wv) | ((m == wv) & (am < wi)))
                slot = (bv == wv[:, None]) & (bi == wi[:, None]) & better[:, None]
                bv = tl.where(slot, m[:, None], bv)
                bi = tl.where(slot, am[:, None], bi)
                s = tl.where(kid[None, :] == am[:, None], float("-inf"), s)
        res = tl.where(bi < n_k, bi, -1)
        tl.store(OUT + (bkv * n_q + offs_q)[:, None] * TOPK + cols[None, :], res,
                 mask=qmask[:, None] & (cols[None, :] < TOPK))

    return topk_kernel


def select_blocks_triton(q: torch.Tensor, summary: torch.Tensor, spec: SparseSpec, q_block_offset: int = 0
                         ) -> torch.Tensor:
    """Same contract as `select_blocks_torch`: (B, Hq, Lq, D) queries, (B, Hkv, nK, D) key-block means ->
    (B, Hkv, nQ, budget) int32."""
    import triton

    top_k = spec.top_k
    with torch.no_grad(), on_device(q):
        summary = summary.float().contiguous()  # (B, Hkv, nK, D)
        b, hkv, n_k, d = summary.shape
        qs = group_query_sums(q, hkv, spec.block_size).contiguous()  # (B, Hkv, nQ, D) fp32
        n_q = qs.shape[2]
        q_ids = torch.arange(q_block_offset, q_block_offset + n_q, device=q.device)
        topk_ids = torch.full((b, hkv, n_q, top_k), -1, dtype=torch.int32, device=q.device)
        if top_k > 0:
            _kernel()[(triton.cdiv(n_q, _QT), b * hkv)](
                qs, summary, topk_ids, n_q, n_k, q_block_offset, spec.local_blocks, spec.sink_blocks,
                TOPK=top_k, KP=max(2, triton.next_power_of_2(top_k)), D=d, BD=max(16, triton.next_power_of_2(d)),
                QT=_QT, T=_T)
        return assemble_indices(topk_ids, q_ids, spec.local_blocks, spec.sink_blocks)
