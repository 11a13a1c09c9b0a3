"""Block-sparse attention over ONE PIECE of the keys, with its log-sum-exp, and the matching backward.

Context parallelism's `stream` mode (lcft.parallel.cp_stream) attends to the window's keys one piece at a
time, so no rank ever holds the whole window's K/V: each piece gives a partial output normalised over that
piece alone plus the row's log-sum-exp over it, and the pieces merge exactly as
out = sum_j exp(lse_j - lse) * out_j with lse = logsumexp_j lse_j (flash-attention's split-KV rule). The
backward of one piece needs only that piece's K/V and the MERGED lse and delta = rowsum(dO * O):
P = exp(S - lse) is then the piece's slice of the full softmax, so dQ (summed over pieces), dK and dV (of the
piece) are exact. Chunked PyTorch like sparse_cpu (both build on lcft.kernels.sparse_blocks), so it runs on
any device.

`indices` (B, Hkv, nQ, W) hold positions of key blocks IN THIS PIECE's k/v (-1 padded, no duplicates).
`diag_offset`: key block diag_offset + i is query block i's own block (causal mask inside it); None: every
chosen block lies wholly before its queries (a piece held by another rank).
"""

from __future__ import annotations

import torch

from lcft.kernels.sparse_blocks import (
    BlockLayout,
    BlockPlan,
    causal_bias,
    chunk_scores,
    chunk_size,
    grouped,
    run_over_heads,
)


class PiecePlan:
    """Gather ids of the chosen blocks per (B·Hkv row, query block) into the (B·Hkv·nK, block, D) view of k/v:
    `others` (BH, nQ, width) with the valid slots first (`valid`), and `own` (BH, nQ, 1) when there is a
    diagonal block. A chunk of query blocks computes only as many slots as its fullest row needs."""

    def __init__(self, indices: torch.Tensor, n_k: int, diag_offset: int | None) -> None:
        self.diag = diag_offset is not None
        self.own: torch.Tensor | None = None
        if self.diag:
            plan = BlockPlan(indices, n_k, diag_offset)  # others sorted valid-first, own block last
            self.others, self.own, self.valid = plan.flat[..., :-1], plan.flat[..., -1:], plan.valid
        else:
            b, hkv, _, _ = indices.shape
            idx = indices.long().flatten(0, 1)  # (BH, nQ, S)
            idx = torch.where(idx >= 0, idx, n_k).sort(dim=-1).values  # valid first
            base = (torch.arange(b * hkv, device=idx.device) * n_k).view(-1, 1, 1)  # (BH, 1, 1)
            self.valid = idx < n_k
            self.others = base + torch.where(self.valid, idx, 0)
        # Per query block: the most slots any row fills. Chunks whose rows choose nothing here are skipped
        # (for zigzag shards, the early chunk's queries see none of the other ranks' late blocks).
        self.counts = self.valid.sum(-1).amax(0).tolist()  # nQ ints
        self.empty = [c == 0 and not self.diag for c in self.counts]

    def chunk(self, rows: slice, i0: int, i1: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(flat ids (h, C, slots), valid (h, C, w) of the non-own slots, w) of query blocks i0:i1."""
        w = max(self.counts[i0:i1])
        flat = self.others[rows, i0:i1, :w]
        if self.own is not None:
            flat = torch.cat([flat, self.own[rows, i0:i1]], dim=-1)  # own block last
        return flat, self.valid[rows, i0:i1, :w], w


def _scores(qc: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, plan: PiecePlan, rows: slice, i0: int, i1: int,
            tri: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 scores of one chunk (h, C, G·block, slots·block) with masks applied, gathered K, V and flat ids."""
    flat, valid, _ = plan.chunk(rows, i0, i1)
    return chunk_scores(qc, kb, vb, flat, valid, tri, own_last=plan.diag, masked=not bool(valid.all()),
                        dtype=torch.float32)


class _Piece(BlockLayout):
    """Sizes and grouped views shared by forward and backward of one piece, with its plan and chunking."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, indices: torch.Tensor, block: int,
                 diag_offset: int | None) -> None:
        super().__init__(q, k, block)
        self.plan = PiecePlan(indices, self.n_k, diag_offset)
        self.chunk = chunk_size(self.group, block, max(1, max(self.plan.counts, default=0) + int(self.plan.diag)))
        self.tri = causal_bias(block, torch.float32, q.device)  # (block, block)


def partial_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                              block_size: int, diag_offset: int | None = None,
                              acc: tuple[torch.Tensor, torch.Tensor] | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, Hq, Lq, D) over the chosen blocks of this piece k, v (B, Hkv, Lk, D); no autograd.

    Returns out (B, Hq, Lq, D) fp32, normalised over this piece only, and lse (B, Hq, Lq) fp32, the
    log-sum-exp of the row's scaled scores over this piece (-inf, with out 0, where nothing was chosen).
    acc = (out, lse) of earlier pieces (contiguous fp32): this piece is merged into them in place, chunk by
    chunk, and they are returned (no full-size temporaries; chunks with nothing chosen are not touched)."""
    pc = _Piece(q, k, indices, block_size, diag_offset)
    kb, vb, plan = pc.blocks(k), pc.blocks(v), pc.plan
    bh, g, n_q = pc.b * pc.hkv, pc.group, pc.n_q
    if acc is None:
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # (B, Hq, Lq, D)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)  # (B, Hq, Lq)
    else:
        out, lse = acc
    og, lg = grouped(out, pc.hkv, block_size), grouped(lse[..., None], pc.hkv, block_size)  # views
    merge = acc is not None

    def work(h0: int, h1: int) -> None:
        rows = slice(h0, h1)
        for i0 in range(0, n_q, pc.chunk):
            i1 = min(n_q, i0 + pc.chunk)
            if all(plan.empty[i0:i1]):
                continue  # nothing chosen here: out stays 0 and lse -inf (or the accumulated values)
            qc = pc.rows(pc.qg, h0, h1, i0, i1) * pc.scale  # (h, C, G·block, D)
            s, _, vg, _ = _scores(qc, kb, vb, plan, rows, i0, i1, pc.tri)
            mx = s.amax(-1, keepdim=True)  # (h, C, G·block, 1)
            mx = torch.where(torch.isfinite(mx), mx, 0.0)  # rows with nothing chosen: exp(-inf) = 0 below
            e = torch.exp(s - mx)  # (h, C, G·block, slots·block)
            total = e.sum(-1, keepdim=True)  # (h, C, G·block, 1)
            shape = (h1 - h0, i1 - i0, g, block_size)
            o = ((e.to(vg.dtype) @ vg).float() / total.clamp_min(torch.finfo(torch.float32).tiny)).view(*shape, pc.d)
            lc = (mx + torch.log(total)).view(*shape, 1)  # (h, C, G, block, 1)
            if merge:  # out = sum_j exp(lse_j - lse) out_j, lse = logsumexp_j lse_j
                prev = lg[rows, i0:i1]
                both = torch.logaddexp(prev, lc)  # (h, C, G, block, 1)
                ref = torch.where(torch.isfinite(both), both, 0.0)  # both -inf: weights exp(-inf) = 0
                og[rows, i0:i1] = og[rows, i0:i1] * torch.exp(prev - ref) + o * torch.exp(lc - ref)
                lg[rows, i0:i1] = both
            else:
                og[rows, i0:i1] = o
                lg[rows, i0:i1] = lc

    run_over_heads(work, bh)
    return out, lse


def partial_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                               dout: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor, *, block_size: int,
                               diag_offset: int | None = None, dq: torch.Tensor | None = None,
                               dk: torch.Tensor | None = None, dv: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of this piece's share of the MERGED attention: dq (B, Hq, Lq, D) and dk, dv (B, Hkv, Lk, D) for
    this piece's keys, fp32, each ADDED to the contiguous fp32 buffer given (pass one dq to every piece; dk/dv
    can be the send buffer of the exchange that returns them), else new. lse, delta (B, Hq, Lq) fp32 are the
    merged log-sum-exp and rowsum(dout * out) of the merged output; every row's lse must be finite."""
    pc = _Piece(q, k, indices, block_size, diag_offset)
    kb, vb, plan = pc.blocks(k), pc.blocks(v), pc.plan
    bh, g, d = pc.b * pc.hkv, pc.group, pc.d
    dog = grouped(dout.contiguous(), pc.hkv, block_size)  # (BH, nQ, G, block, D)
    lg = grouped(lse.contiguous()[..., None], pc.hkv, block_size)  # (BH, nQ, G, block, 1)
    dg = grouped(delta.contiguous()[..., None], pc.hkv, block_size)  # (BH, nQ, G, block, 1)
    if dq is None:
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # (B, Hq, Lq, D)
    dqg = grouped(dq, pc.hkv, block_size)  # (BH, nQ, G, block, D) view: accumulated in place
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device) if dk is None else dk  # (B, Hkv, Lk, D)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device) if dv is None else dv
    dkb, dvb = dk.view(bh * pc.n_k, block_size, d), dv.view(bh * pc.n_k, block_size, d)  # (BH·nK, block, D)

    def work(h0: int, h1: int) -> None:
        rows = slice(h0, h1)
        for i0 in range(0, pc.n_q, pc.chunk):
            i1 = min(pc.n_q, i0 + pc.chunk)
            if all(plan.empty[i0:i1]):
                continue  # nothing chosen here: no gradient
            qc = pc.rows(pc.qg, h0, h1, i0, i1) * pc.scale  # (h, C, G·block, D)
            doc = pc.rows(dog, h0, h1, i0, i1).to(q.dtype)  # (h, C, G·block, D)
            s, kg, vg, flat = _scores(qc, kb, vb, plan, rows, i0, i1, pc.tri)
            p = torch.exp(s - pc.rows(lg, h0, h1, i0, i1))  # (h, C, G·block, slots·block): slice of the softmax
            dv_part = p.to(q.dtype).transpose(-1, -2) @ doc  # (h, C, slots·block, D)
            dp = (doc @ vg.transpose(-1, -2)).float()  # (h, C, G·block, slots·block)
            ds = dp.sub_(pc.rows(dg, h0, h1, i0, i1)).mul_(p).to(q.dtype)  # (h, C, G·block, slots·block)
            dqg[rows, i0:i1] += ((ds @ kg).float() * pc.scale).view(h1 - h0, i1 - i0, g, block_size, d)
            dk_part = ds.transpose(-1, -2) @ qc  # (h, C, slots·block, D); qc carries the scale
            dkb.index_add_(0, flat, dk_part.reshape(-1, block_size, d).float())
            dvb.index_add_(0, flat, dv_part.reshape(-1, block_size, d).float())

    run_over_heads(work, bh)  # rows own disjoint dK/dV blocks: workers never write the same one
    return dq, dk, dv
