"""The context-parallel attention core: local queries attend over the window's keys held by all cp ranks.

Per layer and rank: the rank's tokens are two chunks of the window (zigzag or contiguous). Key-block
summaries are exchanged so each rank selects key blocks for its OWN query blocks (selection is split across
ranks); then K/V reach the rank — mode 'all' all-gathers every rank's K/V, mode 'selected' fetches only the
blocks its selection needs (all_to_all) — and `sparse_attention_with_indices` runs for each local chunk with
its global query-block offset. Gradients of K/V flow back to their owners through the collectives' backward.
Dense attention under CP is the same path with every earlier block selected.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lcft.parallel import comms
from lcft.parallel.config import ParallelConfig
from lcft.parallel.mesh import ParallelState
from lcft.parallel.sharding import ShardLayout


def _kernels():
    # Imported lazily: lcft.kernels may pull in optional backends (triton) only when attention runs.
    from lcft.kernels import select_blocks, sparse_attention_with_indices
    from lcft.kernels.selection import block_means

    return select_blocks, sparse_attention_with_indices, block_means


def dense_indices(b: int, hkv: int, n_q: int, q_block_offset: int, device: torch.device) -> torch.Tensor:
    """Every key block up to each query block's own: (B, Hkv, nQ, offset + nQ) int32, -1 padded."""
    width = q_block_offset + n_q
    cols = torch.arange(width, device=device)  # (W,)
    own = torch.arange(q_block_offset, width, device=device)[:, None]  # (nQ, 1)
    rows = torch.where(cols[None, :] <= own, cols[None, :], -1).to(torch.int32)  # (nQ, W)
    return rows.expand(b, hkv, n_q, width)


def _global_order(gathered: torch.Tensor, layout: ShardLayout, dim: int) -> torch.Tensor:
    """Every rank's local pieces, gathered on dim 0, laid out in window order along `dim` (of one piece).

    gathered: (cp, ...) where each piece's `dim` holds the rank's two chunks back to back."""
    pieces = gathered.unflatten(dim + 1, (2, -1))  # (cp, ..., 2, chunk, ...)
    by_chunk = {}
    for r in range(layout.cp):
        for s, c in enumerate(layout.chunks(r)):
            by_chunk[c] = pieces[r].select(dim, s)
    return torch.cat([by_chunk[c] for c in range(2 * layout.cp)], dim=dim)


class ContextParallelCore(nn.Module):
    """Drop-in replacement of a block's `attn.core` under context parallelism (holds no parameters).

    `attention` is the model's attention config (backend, block_size, top_k, local_blocks, sink_blocks, impl).
    q (B, Hq, L/cp, D) and k, v (B, Hkv, L/cp, D) are this rank's tokens in local order."""

    def __init__(self, attention: Any, state: ParallelState, cfg: ParallelConfig) -> None:
        super().__init__()
        self.sparse = attention.backend == "sparse"
        self.block = int(attention.block_size)
        self.top_k, self.local_blocks = int(attention.top_k), int(attention.local_blocks)
        self.sink_blocks, self.impl = int(attention.sink_blocks), str(attention.impl)
        self.state, self.cfg = state, cfg

    def extra_repr(self) -> str:
        return (f"cp={self.state.cp}, layout={self.cfg.cp_layout}, kv={self.cfg.cp_kv}, "
                f"{'sparse' if self.sparse else 'dense'}, block={self.block}")

    def layout(self, local_length: int) -> ShardLayout:
        return ShardLayout(local_length * self.state.cp, self.state.cp, self.block, self.cfg.cp_layout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        layout = self.layout(q.shape[2])
        if self.cfg.cp_kv == "selected":
            return self._forward_selected(q, k, v, layout)
        return self._forward_all(q, k, v, layout)

    # -- selection -------------------------------------------------------------------------------------
    def _select(self, q_c: torch.Tensor, summary: torch.Tensor | None, hkv: int, offset: int) -> torch.Tensor:
        """Index rows (B, Hkv, nb, budget) of one local chunk whose first block is global block `offset`;
        `summary` (B, Hkv, nK, D) holds the window's key-block means (None for dense attention)."""
        select_blocks, _, _ = _kernels()
        n_q = q_c.shape[2] // self.block
        if summary is None:
            return dense_indices(q_c.shape[0], hkv, n_q, offset, q_c.device)
        return select_blocks(q_c, None, block_size=self.block, top_k=self.top_k, local_blocks=self.local_blocks,
                             sink_blocks=self.sink_blocks, q_block_offset=offset,
                             k_summary=summary[:, :, : offset + n_q])

    def _attend(self, q_c, k_c, v_c, idx, offset) -> torch.Tensor:
        _, attend, _ = _kernels()
        return attend(q_c, k_c, v_c, idx, block_size=self.block, q_block_offset=offset, impl=self.impl)

    # -- mode 'all': all-gather K/V ---------------------------------------------------------------------
    def _forward_all(self, q, k, v, layout: ShardLayout) -> torch.Tensor:
        _, _, block_means = _kernels()
        group, c, nb = self.state.cp_group, layout.chunk, layout.chunk_blocks
        kv = torch.stack([k, v])  # (2, B, Hkv, L/cp, D)
        gathered = comms.all_gather(kv, group, tag="kv")  # (cp, 2, B, Hkv, L/cp, D)
        kv_glob = _global_order(gathered, layout, dim=3)  # (2, B, Hkv, L, D)
        # Summaries straight from the gathered keys: the same numbers one process computes, no extra message.
        summary = block_means(kv_glob[0].detach(), self.block) if self.sparse else None  # (B, Hkv, nK, D)
        outs = []
        for s, chunk in enumerate(layout.chunks(self.state.cp_rank)):
            q_c = q[:, :, s * c:(s + 1) * c]  # (B, Hq, C, D)
            offset = chunk * nb
            idx = self._select(q_c, summary, k.shape[1], offset)  # (B, Hkv, nb, budget)
            end = (chunk + 1) * c  # keys after the chunk are never attended (causal)
            outs.append(self._attend(q_c, kv_glob[0, :, :, :end], kv_glob[1, :, :, :end], idx, offset))
        return torch.cat(outs, dim=2)  # (B, Hq, L/cp, D)

    # -- mode 'selected': fetch only the needed K/V blocks ----------------------------------------------
    def _forward_selected(self, q, k, v, layout: ShardLayout) -> torch.Tensor:
        _, _, block_means = _kernels()
        st, blk = self.state, self.block
        group, c, nb, cp = st.cp_group, layout.chunk, layout.chunk_blocks, st.cp
        b, hkv, n_loc = k.shape[0], k.shape[1], 2 * layout.chunk_blocks
        dev = q.device
        summary = None  # dense attention needs no scores
        if self.sparse:
            local_summary = block_means(k.detach(), blk)  # (B, Hkv, 2nb, D) fp32
            summary = _global_order(comms.all_gather_nograd(local_summary, group, tag="summary"),
                                    layout, dim=2)  # (B, Hkv, nK, D)
        my_chunks = layout.chunks(st.cp_rank)
        plans = []  # per local chunk: (query slice, global offset, index rows, earlier remote/local ids)
        for s, chunk in enumerate(my_chunks):
            q_c = q[:, :, s * c:(s + 1) * c]  # (B, Hq, C, D)
            offset = chunk * nb
            idx = self._select(q_c, summary, hkv, offset)  # (B, Hkv, nb, budget)
            used = torch.unique(idx[idx >= 0].long())  # sorted global key-block ids
            plans.append((q_c, offset, idx, used[used < offset]))

        # Blocks to fetch = the earlier blocks of both chunks not held here, grouped by owner rank.
        owner_of_chunk = torch.tensor([layout.owner(i)[0] for i in range(2 * cp)], device=dev)
        slot_of_chunk = torch.tensor([layout.owner(i)[1] for i in range(2 * cp)], device=dev)
        wanted = torch.unique(torch.cat([p[3] for p in plans]))
        owners = owner_of_chunk[wanted // nb]
        remote = wanted[owners != st.cp_rank]
        remote = remote[torch.argsort(owner_of_chunk[remote // nb], stable=True)]  # by owner, ids ascending
        send_counts = torch.bincount(owner_of_chunk[remote // nb], minlength=cp)  # (cp,) requests per owner
        recv_counts = comms.all_to_all_nograd(send_counts, [1] * cp, [1] * cp, group, tag="index")
        ask, give = send_counts.tolist(), recv_counts.tolist()
        requested = comms.all_to_all_nograd(remote, give, ask, group, tag="index")  # ids others want from me
        kv_loc = torch.stack([k, v]).unflatten(3, (n_loc, blk))  # (2, B, Hkv, 2nb, block, D)
        local_row = slot_of_chunk[requested // nb] * nb + requested % nb  # (nReq,)
        rows = kv_loc.index_select(3, local_row).movedim(3, 0)  # (nReq, 2, B, Hkv, block, D)
        got = comms.all_to_all(rows, ask, give, group, tag="kv")  # (nRemote, 2, B, Hkv, block, D)

        # Pool = my blocks then the fetched ones; row_of maps a global block id to its pool row.
        pool = torch.cat([kv_loc.movedim(3, 0), got], dim=0)  # (2nb + nRemote, 2, B, Hkv, block, D)
        row_of = torch.full((2 * cp * nb,), -1, dtype=torch.long, device=dev)
        for s, chunk in enumerate(my_chunks):
            row_of[chunk * nb:(chunk + 1) * nb] = torch.arange(s * nb, (s + 1) * nb, device=dev)
        row_of[remote] = torch.arange(n_loc, n_loc + remote.numel(), device=dev)

        outs = []
        for q_c, offset, idx, earlier in plans:
            # Compact keys: the earlier blocks this chunk selected (ascending), then the chunk's own blocks.
            # Renumbering is monotone, so causality (own block last, nothing later) is preserved with the
            # query chunk placed at compact block m.
            m = earlier.numel()
            ids = torch.cat([earlier, torch.arange(offset, offset + nb, device=dev)])  # (m + nb,)
            kv_c = pool.index_select(0, row_of[ids]).movedim(0, 3)  # (2, B, Hkv, m + nb, block, D)
            kv_c = kv_c.reshape(2, b, hkv, (m + nb) * blk, k.shape[-1])  # (2, B, Hkv, (m+nb)*block, D)
            li = idx.long()
            compact = torch.where(li < offset, torch.searchsorted(earlier, li.clamp(min=0)), m + li - offset)
            compact = torch.where(li < 0, -1, compact).to(torch.int32)  # (B, Hkv, nb, budget)
            outs.append(self._attend(q_c, kv_c[0], kv_c[1], compact, m))
        return torch.cat(outs, dim=2)  # (B, Hq, L/cp, D)
