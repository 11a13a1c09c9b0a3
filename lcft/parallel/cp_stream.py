"""`--cp-kv stream`: the other ranks' K/V reach a rank one piece at a time, never the whole window at once.

Modes 'all' and 'selected' hand the attention kernel the window's K/V in one tensor, and its backward returns
dK/dV for all of it: per rank that is 4 x (window length) x Hkv x D values, which does not shrink as cp
grows. Here each rank cuts its own K/V into `pieces`; at step p every rank sends its piece p to every other
rank (all_to_all_single), attends to the received pieces with the chosen blocks that lie in them, and merges
the partial output by log-sum-exp (lcft.kernels.sparse_partial). Backward fetches each piece again, computes
that piece's dK/dV with the merged lse, and returns them to the owner in the reverse exchange. K/V memory per
rank is then the own shard plus (cp - 1) / pieces of one, for the same result as one process. The price is
bytes: the pieces travel again in backward (under activation checkpointing 'all' re-gathers too).

Runs the chunked PyTorch piece kernel on every device (there is no Triton version of it yet).
"""

from __future__ import annotations

from typing import Any

import torch

from lcft.parallel import comms
from lcft.parallel.mesh import ParallelState
from lcft.parallel.sharding import ShardLayout, renumber_blocks

DEFAULT_PIECES = 8
"""Pieces per rank's K/V shard: the received K/V (and their gradients) are 1/pieces of a shard per step.
More pieces save little more (the own shard, its gradient, q and the output stay) and add kernel calls."""


def piece_count(local_blocks: int, want: int = DEFAULT_PIECES) -> int:
    """The largest count <= want that divides the rank's `local_blocks` key blocks."""
    return max(n for n in range(1, max(1, want) + 1) if local_blocks % n == 0)


class _Stream:
    """Who sends what at each step, for one rank: its piece p goes to every other rank of the cp group."""

    def __init__(self, layout: ShardLayout, state: ParallelState, block: int, pieces: int) -> None:
        self.layout, self.state, self.block = layout, state, block
        self.cp, self.me = state.cp, state.cp_rank
        self.n_local = 2 * layout.chunk_blocks  # key blocks per rank
        self.pieces = piece_count(self.n_local, pieces)
        self.per = self.n_local // self.pieces  # blocks per piece
        self.sources = [r for r in range(self.cp) if r != self.me]
        self.splits = [0 if r == self.me else 1 for r in range(self.cp)]
        self.n_k = 2 * self.cp * layout.chunk_blocks

    def own_ids(self) -> torch.Tensor:
        return self.layout.block_ids(self.me)  # (2nb,) global ids in local order

    def piece_ids(self, rank: int, p: int) -> torch.Tensor:
        """Global ids of `rank`'s blocks in its piece p."""
        return self.layout.block_ids(rank)[p * self.per:(p + 1) * self.per]  # (per,)

    def tokens(self, p: int) -> slice:
        return slice(p * self.per * self.block, (p + 1) * self.per * self.block)

    def fetch(self, k: torch.Tensor, v: torch.Tensor, p: int) -> torch.Tensor:
        """Every other rank's piece p of K and V: (cp-1, 2, B, Hkv, T, D), by source rank (self.sources)."""
        mine = torch.stack([k[:, :, self.tokens(p)], v[:, :, self.tokens(p)]])  # (2, B, Hkv, T, D)
        send = mine.unsqueeze(0).expand(self.cp - 1, *mine.shape)  # (cp-1, 2, B, Hkv, T, D); a view at cp=2
        return comms.all_to_all_nograd(send, self.splits, self.splits, self.state.cp_group, tag="kv")

    def give_back(self, grads: torch.Tensor) -> torch.Tensor:
        """The reverse exchange: grads (cp-1, 2, B, Hkv, T, D) of the received pieces go to their owners;
        returns the gradients of MY piece from each other rank, same shape."""
        return comms.all_to_all_nograd(grads, self.splits, self.splits, self.state.cp_group, tag="kv_grad")


class StreamedAttention(torch.autograd.Function):
    """Local queries over the window's chosen key blocks, the other ranks' K/V streamed in pieces.

    q (B, Hq, L/cp, D), k, v (B, Hkv, L/cp, D) local; rows (B, Hkv, 2nb, W) the selected GLOBAL key-block ids
    of each local query block (own block included). Saves q, k, v, the output, the lse and rows only. One
    kernel call per received piece, so K/V and their gradients are used in place, never re-laid out."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, stream: _Stream) -> torch.Tensor:  # type: ignore[override]
        from lcft.kernels.sparse_partial import partial_attention_forward

        blk, n_k = stream.block, stream.n_k
        out, lse = partial_attention_forward(q, k, v, renumber_blocks(rows, stream.own_ids(), n_k),
                                             block_size=blk, diag_offset=0)  # (B,Hq,Lq,D), (B,Hq,Lq) fp32
        for p in range(stream.pieces):
            got = stream.fetch(k, v, p)  # (cp-1, 2, B, Hkv, T, D)
            for i, r in enumerate(stream.sources):
                partial_attention_forward(q, got[i, 0], got[i, 1], renumber_blocks(rows, stream.piece_ids(r, p), n_k),
                                          block_size=blk, acc=(out, lse))  # merged into out, lse in place
            del got
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, rows)
        ctx.stream = stream
        ctx.mark_non_differentiable(rows)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:  # type: ignore[override]
        from lcft.kernels.sparse_blocks import output_delta
        from lcft.kernels.sparse_partial import partial_attention_backward

        q, k, v, out, lse, rows = ctx.saved_tensors
        stream, blk, n_k = ctx.stream, ctx.stream.block, ctx.stream.n_k
        dout = dout.contiguous()
        delta = output_delta(dout, out)  # (B, Hq, Lq) rowsum(dO · O)
        dq, dk, dv = partial_attention_backward(q, k, v, renumber_blocks(rows, stream.own_ids(), n_k), dout, lse, delta,
                                                block_size=blk, diag_offset=0)  # fp32
        for p in range(stream.pieces):
            got = stream.fetch(k, v, p)  # (cp-1, 2, B, Hkv, T, D): fetched again, forward kept none of it
            grads = torch.zeros(got.shape, dtype=torch.float32, device=got.device)  # the return exchange's buffer
            for i, r in enumerate(stream.sources):
                partial_attention_backward(q, got[i, 0], got[i, 1], renumber_blocks(rows, stream.piece_ids(r, p), n_k),
                                           dout, lse, delta, block_size=blk, dq=dq, dk=grads[i, 0], dv=grads[i, 1])
            del got
            back = stream.give_back(grads)  # (cp-1, 2, B, Hkv, T, D): gradients of my piece p
            del grads
            dk[:, :, stream.tokens(p)] += back[:, 0].sum(0)
            dv[:, :, stream.tokens(p)] += back[:, 1].sum(0)
            del back
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def stream_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, layout: ShardLayout,
                     state: ParallelState, block: int, pieces: int = DEFAULT_PIECES) -> torch.Tensor:
    """Differentiable attention of the local q over the chosen blocks of the whole window (see module doc)."""
    return StreamedAttention.apply(q, k, v, rows, _Stream(layout, state, block, pieces))
