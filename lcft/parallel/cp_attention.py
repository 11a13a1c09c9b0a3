"""The context-parallel attention core: local queries attend over the window's keys held by all cp ranks.

Per layer and rank: the rank's tokens are two chunks of the window (zigzag or contiguous). Key-block
summaries are exchanged so each rank selects key blocks for its OWN query blocks (selection is split across
ranks, each chunk with its global query-block offset); then K/V reach the rank — mode 'all' all-gathers every
rank's K/V, mode 'selected' fetches only the blocks its selection needs (all_to_all), mode 'stream' sends the
other ranks' K/V in pieces and merges partial attention by log-sum-exp (cp_stream.py). Gradients of K/V flow
back to their owners through the collectives' backward. Dense attention under CP is the same path with every
earlier block selected.

One kernel call per layer: the keys are laid out as [remote blocks..., this rank's own blocks in local order]
and the selected global block ids are renumbered to that layout. The local queries then sit at block offset
n_remote, each query block's own block at offset + i, and everything it selected before it (remote blocks,
or earlier local blocks: a rank's first chunk always precedes its second), which is all the kernel's causal
rule needs; attention does not depend on the order of the keys, positions being already in RoPE.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lcft.parallel import comms
from lcft.parallel.config import ParallelConfig
from lcft.parallel.cp_stream import stream_attention
from lcft.parallel.mesh import ParallelState
from lcft.parallel.sharding import ShardLayout, renumber_blocks


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


def _window_order(seq_ids: torch.Tensor) -> torch.Tensor:
    """Gather index that puts per-position data (position p holds global block seq_ids[p]) in window order."""
    return torch.argsort(seq_ids)


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
        _, attend, block_means = _kernels()
        layout = self.layout(q.shape[2])
        st, group, n_k = self.state, self.state.cp_group, 2 * layout.cp * layout.chunk_blocks
        if self.cfg.cp_kv == "all":
            # Keys of every rank, own rank last: (B, Hkv, L, D) each; gradients reduce-scatter to the owners.
            k_all = comms.gather_own_last(k, group, dim=2, tag="kv")
            v_all = comms.gather_own_last(v, group, dim=2, tag="kv")
            order = [(st.cp_rank + 1 + i) % st.cp for i in range(st.cp)]
            seq_ids = torch.cat([layout.block_ids(r) for r in order]).to(q.device)  # (nK,) id at each position
            summary = None  # window-order key-block means, the same numbers one process computes
            if self.sparse:
                summary = block_means(k_all.detach(), self.block)[:, :, _window_order(seq_ids)]  # (B,Hkv,nK,D)
            rows = self._rows(q, summary, k.shape[1], layout)  # (B, Hkv, 2nb, W) global ids
        else:
            summary = None
            if self.sparse:
                local = block_means(k.detach(), self.block)  # (B, Hkv, 2nb, D) fp32
                gathered = comms.all_gather_nograd(local, group, tag="summary")  # (cp, B, Hkv, 2nb, D)
                rank_ids = torch.cat([layout.block_ids(r) for r in range(st.cp)]).to(q.device)  # (nK,)
                summary = gathered.movedim(0, 2).flatten(2, 3)[:, :, _window_order(rank_ids)]  # (B,Hkv,nK,D)
            rows = self._rows(q, summary, k.shape[1], layout)  # (B, Hkv, 2nb, W) global ids
            if self.cfg.cp_kv == "stream":
                return stream_attention(q, k, v, rows, layout, st, self.block)  # (B, Hq, L/cp, D)
            k_all, v_all, seq_ids = self._fetch_selected(k, v, rows, layout)
        compact = renumber_blocks(rows, seq_ids, n_k)  # (B, Hkv, 2nb, W') positions in the key layout
        offset = seq_ids.numel() - 2 * layout.chunk_blocks  # own blocks come last
        return attend(q, k_all, v_all, compact, block_size=self.block, q_block_offset=offset,
                      impl=self.impl)  # (B, Hq, L/cp, D)

    def _rows(self, q: torch.Tensor, summary: torch.Tensor | None, hkv: int, layout: ShardLayout
              ) -> torch.Tensor:
        """Selected global key-block ids of every local query block (B, Hkv, 2nb, W), -1 padded: each local
        chunk is selected with its own global query-block offset, against the window-order `summary`
        (None = dense: every block up to the own one)."""
        select_blocks, _, _ = _kernels()
        c, nb = layout.chunk, layout.chunk_blocks
        parts = []
        for s, chunk in enumerate(layout.chunks(self.state.cp_rank)):
            offset = chunk * nb
            q_c = q[:, :, s * c:(s + 1) * c]  # (B, Hq, C, D)
            if summary is None:
                parts.append(dense_indices(q.shape[0], hkv, nb, offset, q.device))
            else:
                parts.append(select_blocks(q_c, None, block_size=self.block, top_k=self.top_k,
                                           local_blocks=self.local_blocks, sink_blocks=self.sink_blocks,
                                           q_block_offset=offset, k_summary=summary[:, :, :offset + nb]))
        width = max(p.shape[-1] for p in parts)
        parts = [F.pad(p, (0, width - p.shape[-1]), value=-1) for p in parts]
        return torch.cat(parts, dim=2)  # (B, Hkv, 2nb, W)

    def _fetch_selected(self, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, layout: ShardLayout
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mode 'selected': fetch from their owners only the remote K/V blocks some local row selected.
        Returns keys and values laid out [fetched blocks (by owner, then id), own blocks] and the global
        block id at each position."""
        st, group, blk, nb, cp = self.state, self.state.cp_group, self.block, layout.chunk_blocks, self.state.cp
        b, hkv, d, dev = k.shape[0], k.shape[1], k.shape[-1], k.device
        owner_of_chunk = torch.tensor([layout.owner(i)[0] for i in range(2 * cp)], device=dev)
        slot_of_chunk = torch.tensor([layout.owner(i)[1] for i in range(2 * cp)], device=dev)
        used = torch.unique(rows[rows >= 0].long())  # sorted global ids
        remote = used[owner_of_chunk[used // nb] != st.cp_rank]
        remote = remote[torch.argsort(owner_of_chunk[remote // nb], stable=True)]  # by owner, ids ascending
        ask = torch.bincount(owner_of_chunk[remote // nb], minlength=cp)  # (cp,) blocks wanted from each rank
        give = comms.all_to_all_nograd(ask, [1] * cp, [1] * cp, group, tag="index")  # (cp,) wanted from me
        ask_l, give_l = ask.tolist(), give.tolist()
        requested = comms.all_to_all_nograd(remote, give_l, ask_l, group, tag="index")  # ids others want
        local_row = slot_of_chunk[requested // nb] * nb + requested % nb  # (nReq,) my block index
        kv_blocks = torch.stack([k, v]).unflatten(3, (2 * nb, blk))  # (2, B, Hkv, 2nb, block, D)
        send = kv_blocks.index_select(3, local_row).movedim(3, 0)  # (nReq, 2, B, Hkv, block, D)
        got = comms.all_to_all(send, ask_l, give_l, group, tag="kv")  # (nRemote, 2, B, Hkv, block, D)
        n_r = remote.numel()
        got = got.movedim(0, 3).reshape(2, b, hkv, n_r * blk, d)  # (2, B, Hkv, nRemote*block, D)
        k_c = torch.cat([got[0], k], dim=2)  # (B, Hkv, nRemote*block + L/cp, D)
        v_c = torch.cat([got[1], v], dim=2)
        seq_ids = torch.cat([remote, layout.block_ids(st.cp_rank).to(dev)])  # (nRemote + 2nb,)
        return k_c, v_c, seq_ids
