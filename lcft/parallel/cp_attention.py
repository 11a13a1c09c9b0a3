"""The context-parallel attention core: local queries attend over the window's keys held by all cp ranks.

Per layer and rank: the rank's tokens are two chunks of the window (zigzag or contiguous). The spec's selector
summarises key blocks and the summaries are exchanged, so each rank selects key blocks for its OWN query blocks
(selection is split across ranks, each chunk with its global query-block offset); then K/V reach the rank by
one strategy per --cp-kv mode (KV_MODES, chosen once per core): 'all' all-gathers every rank's K/V, 'selected'
fetches only the blocks its selection needs (all_to_all), 'stream' sends the other ranks' K/V in pieces and
merges partial attention by log-sum-exp (cp_stream.py). Gradients of K/V flow
back to their owners through the collectives' backward. Dense attention under CP is the same path with every
earlier block selected.

One kernel call per layer: the keys are laid out as [remote blocks..., this rank's own blocks in local order]
and the selected global block ids are renumbered to that layout. The local queries then sit at block offset
n_remote, each query block's own block at offset + i, and everything it selected before it (remote blocks,
or earlier local blocks: a rank's first chunk always precedes its second), which is all the kernel's causal
rule needs; attention does not depend on the order of the keys, positions being already in RoPE.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lcft.kernels.selection_memo import remembered
from lcft.parallel import comms
from lcft.parallel.config import CpConfig
from lcft.parallel.cp_stream import stream_attention
from lcft.parallel.mesh import ParallelState
from lcft.parallel.sharding import ShardLayout, renumber_blocks


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, block_size: int,
            q_block_offset: int, impl: str) -> torch.Tensor:
    # Imported lazily: lcft.kernels may pull in optional backends (triton) only when attention runs.
    from lcft.kernels import sparse_attention_with_indices

    return sparse_attention_with_indices(q, k, v, indices, block_size=block_size, q_block_offset=q_block_offset,
                                         impl=impl)


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


class Selection:
    """Which key blocks the local query blocks read: the spec's selector summarises key blocks (each rank its
    own, or the gathered window's), and selects for each local chunk at its global query-block offset."""

    def __init__(self, attention: Any, state: ParallelState) -> None:
        from lcft.kernels.selectors import get_selector

        self.sparse, self.spec, self.state = attention.backend == "sparse", attention.sparse, state
        self.selector = get_selector(self.spec.selector) if self.sparse else None

    def exchanged_summary(self, k: torch.Tensor, layout: ShardLayout) -> torch.Tensor | None:
        """Window-order summaries (B, Hkv, nK, ...) from every rank's summary of its own keys; None = dense."""
        if self.selector is None:
            return None
        st = self.state
        local = self.selector.summarise(k.detach(), self.spec)  # (B, Hkv, 2nb, ...)
        gathered = comms.all_gather_nograd(local, st.cp_group, tag="summary")  # (cp, B, Hkv, 2nb, ...)
        rank_ids = torch.cat([layout.block_ids(r) for r in range(st.cp)]).to(k.device)  # (nK,)
        return gathered.movedim(0, 2).flatten(2, 3)[:, :, _window_order(rank_ids)]  # (B, Hkv, nK, ...)

    def window_summary(self, k_all: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor | None:
        """Window-order summaries of gathered keys whose position p holds global block seq_ids[p]."""
        if self.selector is None:
            return None
        return self.selector.summarise(k_all.detach(), self.spec)[:, :, _window_order(seq_ids)]  # (B,Hkv,nK,...)

    def chosen(self, q: torch.Tensor, summary: Callable[[], torch.Tensor | None], hkv: int, layout: ShardLayout
               ) -> torch.Tensor:
        """`rows` against the summaries `summary()` makes, or, in a checkpoint's recompute, the rows its forward
        chose (lcft.kernels.selection_memo): every rank then skips the summary exchange there alike. Dense rows
        (every earlier block: W up to the window's blocks) are made again, not kept across the step."""
        if self.selector is None:
            return self.rows(q, None, hkv, layout)  # (B, Hkv, 2nb, W)
        return remembered(lambda: self.rows(q, summary(), hkv, layout))  # (B, Hkv, 2nb, W)

    def rows(self, q: torch.Tensor, summary: torch.Tensor | None, hkv: int, layout: ShardLayout) -> torch.Tensor:
        """Selected global key-block ids of every local query block (B, Hkv, 2nb, W), -1 padded: each local
        chunk is selected with its own global query-block offset, against the window-order `summary`
        (None = dense: every block up to the own one)."""
        c, nb = layout.chunk, layout.chunk_blocks
        parts = []
        for s, chunk in enumerate(layout.chunks(self.state.cp_rank)):
            offset = chunk * nb
            if summary is None:
                parts.append(dense_indices(q.shape[0], hkv, nb, offset, q.device))
                continue
            q_c = q[:, :, s * c:(s + 1) * c].detach()  # (B, Hq, C, D)
            with torch.no_grad():
                parts.append(self.selector.select(q_c, summary[:, :, :offset + nb], self.spec, offset))
        width = max(p.shape[-1] for p in parts)
        parts = [F.pad(p, (0, width - p.shape[-1]), value=-1) for p in parts]
        return torch.cat(parts, dim=2)  # (B, Hkv, 2nb, W)


class KVMode:
    """How the other ranks' K/V reach this rank (--cp-kv); `attend` = the local queries' attention output."""

    def __init__(self, selection: Selection, impl: str) -> None:
        self.sel, self.state, self.impl = selection, selection.state, impl
        self.block = selection.spec.block_size

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
        raise NotImplementedError

    def _one_call(self, q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, rows: torch.Tensor,
                  seq_ids: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
        """One kernel call over keys laid out as `seq_ids` (own blocks last), rows renumbered to that layout."""
        compact = renumber_blocks(rows, seq_ids, 2 * layout.cp * layout.chunk_blocks)  # (B, Hkv, 2nb, W')
        offset = seq_ids.numel() - 2 * layout.chunk_blocks  # own blocks come last
        return _attend(q, k_all, v_all, compact, block_size=self.block, q_block_offset=offset,
                       impl=self.impl)  # (B, Hq, L/cp, D)


class AllKV(KVMode):
    """'all': every rank's K/V all-gathered (own rank last); gradients reduce-scatter to the owners."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
        st, group = self.state, self.state.cp_group
        k_all = comms.gather_own_last(k, group, dim=2, tag="kv")  # (B, Hkv, L, D)
        v_all = comms.gather_own_last(v, group, dim=2, tag="kv")  # (B, Hkv, L, D)
        order = [(st.cp_rank + 1 + i) % st.cp for i in range(st.cp)]
        seq_ids = torch.cat([layout.block_ids(r) for r in order]).to(q.device)  # (nK,) id at each position
        # Summaries of the gathered keys in window order: the same numbers one process computes.
        rows = self.sel.chosen(q, lambda: self.sel.window_summary(k_all, seq_ids), k.shape[1], layout)  # (B,Hkv,2nb,W)
        return self._one_call(q, k_all, v_all, rows, seq_ids, layout)


class SelectedKV(KVMode):
    """'selected': summaries exchanged, then only the remote K/V blocks some local row selected (all_to_all)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
        rows = self.sel.chosen(q, lambda: self.sel.exchanged_summary(k, layout), k.shape[1], layout)  # (B,Hkv,2nb,W)
        k_all, v_all, seq_ids = self._fetch_selected(k, v, rows, layout)
        return self._one_call(q, k_all, v_all, rows, seq_ids, layout)

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


class StreamKV(KVMode):
    """'stream': summaries exchanged, the other ranks' K/V then arrive a piece at a time (cp_stream.py)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: ShardLayout) -> torch.Tensor:
        rows = self.sel.chosen(q, lambda: self.sel.exchanged_summary(k, layout), k.shape[1], layout)  # (B,Hkv,2nb,W)
        return stream_attention(q, k, v, rows, layout, self.state, self.block)  # (B, Hq, L/cp, D)


KV_MODES: dict[str, type[KVMode]] = {"all": AllKV, "selected": SelectedKV, "stream": StreamKV}
"""The --cp-kv strategies by name (CpConfig.cp_kv)."""


class ContextParallelCore(nn.Module):
    """Drop-in replacement of a block's `attn.core` under context parallelism (holds no parameters).

    `attention` is the model's AttentionConfig (backend, impl, sparse spec). q (B, Hq, L/cp, D) and
    k, v (B, Hkv, L/cp, D) are this rank's tokens in local order."""

    def __init__(self, attention: Any, state: ParallelState, cfg: CpConfig) -> None:
        super().__init__()
        self.state, self.cfg = state, cfg
        self.selection = Selection(attention, state)
        self.block = self.selection.spec.block_size
        self.kv = KV_MODES[cfg.cp_kv](self.selection, str(attention.impl))

    def extra_repr(self) -> str:
        return (f"cp={self.state.cp}, layout={self.cfg.cp_layout}, kv={self.cfg.cp_kv}, "
                f"{'sparse' if self.selection.sparse else 'dense'}, block={self.block}")

    def layout(self, local_length: int) -> ShardLayout:
        return ShardLayout(local_length * self.state.cp, self.state.cp, self.block, self.cfg.cp_layout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.kv.attend(q, k, v, self.layout(q.shape[2]))  # (B, Hq, L/cp, D)
