"""Block layouts shared by the chunked PyTorch kernels (sparse_cpu, sparse_partial): the gather plan, grouped
views, the causal bias, chunk sizes, per-head worker threads and the masked scores of one chunk; and the
backward's rowsum(dO · O), which the Triton and context-parallel backwards share."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

# Scratch target per chunk and head (score entries): scores stay in the per-core cache.
CHUNK_SCORE_ELEMS = 1 << 17


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


def run_over_heads(fn: Callable[[int, int], None], n_bh: int) -> None:
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


def causal_bias(block: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(block, block) additive bias: -inf where the key comes after the query inside the own block."""
    return torch.full((block, block), float("-inf"), dtype=dtype, device=device).triu_(1)


def grouped(x: torch.Tensor, hkv: int, block: int) -> torch.Tensor:
    """(B, Hq, L, D) -> (B·Hkv, nQ, G, block, D) view (the group's heads next to their query block)."""
    b, hq, length, d = x.shape
    return x.view(b, hkv, hq // hkv, length // block, block, d).permute(0, 1, 3, 2, 4, 5).flatten(0, 1)


def ungrouped(x: torch.Tensor, b: int) -> torch.Tensor:
    """(B·Hkv, nQ, G, block, D) -> (B, Hq, L, D)."""
    bh, n_q, g, block, d = x.shape
    return x.view(b, bh // b, n_q, g, block, d).permute(0, 1, 3, 2, 4, 5).reshape(b, bh // b * g, n_q * block, d)


def chunk_size(group: int, block: int, slots: int) -> int:
    """Query blocks per chunk, so one head's scores take about CHUNK_SCORE_ELEMS entries."""
    return max(1, CHUNK_SCORE_ELEMS // (group * block * slots * block))


class BlockLayout:
    """What forward and backward both derive from q and k: sizes, the scale and the grouped queries."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, block: int) -> None:
        b, hq, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        self.b, self.hkv, self.d, self.block = b, hkv, d, block
        self.group, self.n_q, self.n_k = hq // hkv, lq // block, lk // block
        self.scale = 1.0 / math.sqrt(d)
        self.qg = grouped(q, hkv, block)  # (BH, nQ, G, block, D)

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """Keys or values (B, Hkv, Lk, D) -> the (B·Hkv·nK, block, D) view the gather ids index."""
        return x.contiguous().view(self.b * self.hkv * self.n_k, self.block, self.d)

    def rows(self, x: torch.Tensor, h0: int, h1: int, i0: int, i1: int) -> torch.Tensor:
        """Grouped (BH, nQ, G, block, E) -> the chunk's (h, C, G·block, E)."""
        return x[h0:h1, i0:i1].reshape(h1 - h0, i1 - i0, self.group * self.block, x.shape[-1])


def chunk_scores(qc: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, flat: torch.Tensor, valid: torch.Tensor,
                 tri: torch.Tensor, *, own_last: bool, masked: bool, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores of one chunk with its gathered keys and values.

    qc (h, C, G·block, D) pre-scaled queries; flat (h, C, slots) gather ids into kb/vb (BH·nK, block, D), the
    own block last when `own_last` (its causal bias `tri` is added); valid (h, C, w) marks the real non-own
    slots (padding is masked to -inf when `masked`). Scores are cast to `dtype` before the masks.
    Returns s (h, C, G·block, slots·block), kg and vg (h, C, slots·block, D), and the flat ids (h·C·slots,).
    """
    h, c, m, d = qc.shape
    block, slots, w = tri.shape[0], flat.shape[-1], valid.shape[-1]
    flat = flat.reshape(-1)  # (h·C·slots,)
    kg = kb.index_select(0, flat).view(h, c, slots * block, d)  # (h, C, slots·block, D)
    vg = vb.index_select(0, flat).view(h, c, slots * block, d)  # (h, C, slots·block, D)
    s = (qc @ kg.transpose(-1, -2)).to(dtype)  # (h, C, G·block, slots·block)
    s6 = s.view(h, c, m // block, block, slots, block)
    if own_last:
        s6[..., w, :] += tri
    if masked:
        pad = torch.zeros(h, c, slots, dtype=s.dtype, device=s.device)  # (h, C, slots)
        pad[..., :w].masked_fill_(~valid, float("-inf"))
        s6 += pad[:, :, None, None, :, None]
    return s, kg, vg, flat


def output_delta(dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """rowsum(dO · O) in fp32: (B, Hq, L, D) twice -> (B, Hq, L). A head at a time when they are not fp32: whole
    fp32 copies of both and their product were 24 GiB at 1M tokens for 32 heads of 64."""
    if dout.dtype == out.dtype == torch.float32:
        return (dout * out).sum(-1)  # (B, Hq, L)
    b, hq, length, _ = out.shape
    delta = torch.empty(b, hq, length, dtype=torch.float32, device=out.device)  # (B, Hq, L)
    for h in range(hq):
        delta[:, h] = (dout[:, h].float() * out[:, h].float()).sum(-1)  # (B, L)
    return delta
