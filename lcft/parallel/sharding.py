"""Which tokens of a window each cp rank holds (zigzag or contiguous chunks) and their global positions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from lcft.parallel.config import CpLayout
from lcft.shapes import check_length


def rank_chunks(cp_rank: int, cp: int, layout: CpLayout) -> tuple[int, int]:
    """The two global chunk ids (of 2*cp) rank `cp_rank` holds, in local order."""
    if layout == "zigzag":
        # Causal work grows with position; pairing chunk r with its mirror 2cp-1-r equalises it.
        return cp_rank, 2 * cp - 1 - cp_rank
    if layout == "contiguous":
        return 2 * cp_rank, 2 * cp_rank + 1
    raise AssertionError(f"unknown cp layout {layout!r}")  # the names are checked once, by config coercion


@dataclass(frozen=True)
class ShardLayout:
    """The split of one window of `length` tokens over `cp` ranks into 2*cp chunks of whole blocks."""

    length: int
    """Tokens in the full window."""
    cp: int
    """Number of ranks sharing the window."""
    block: int
    """Attention block size (chunks hold whole blocks)."""
    layout: CpLayout = "zigzag"
    """'zigzag' or 'contiguous' (see CpConfig.cp_layout)."""

    def __post_init__(self) -> None:
        check_length(self.length, self.cp, self.block)

    @property
    def chunk(self) -> int:
        """Tokens per chunk (each rank holds two)."""
        return self.length // (2 * self.cp)

    @property
    def chunk_blocks(self) -> int:
        """Attention blocks per chunk."""
        return self.chunk // self.block

    @property
    def local_length(self) -> int:
        """Tokens each rank holds."""
        return 2 * self.chunk

    def chunks(self, cp_rank: int) -> tuple[int, int]:
        """Global chunk ids held by `cp_rank`, in local order."""
        return rank_chunks(cp_rank, self.cp, self.layout)

    def owner(self, chunk: int) -> tuple[int, int]:
        """(cp_rank, local slot 0|1) holding global chunk `chunk`."""
        for r in range(self.cp):
            a, b = self.chunks(r)
            if chunk == a:
                return r, 0
            if chunk == b:
                return r, 1
        raise IndexError(f"chunk {chunk} out of range for cp={self.cp}")

    def positions(self, cp_rank: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Global token positions of `cp_rank`'s tokens in local order (L/cp,), for RoPE."""
        a, b = self.chunks(cp_rank)
        c = self.chunk
        return torch.cat([torch.arange(a * c, (a + 1) * c, device=device),
                          torch.arange(b * c, (b + 1) * c, device=device)])  # (L/cp,)

    def block_ids(self, cp_rank: int) -> torch.Tensor:
        """Global block ids of `cp_rank`'s local blocks, in local order (L/cp/block,)."""
        a, b = self.chunks(cp_rank)
        n = self.chunk_blocks
        return torch.cat([torch.arange(a * n, (a + 1) * n), torch.arange(b * n, (b + 1) * n)])

    def shard(self, x: torch.Tensor, cp_rank: int, dim: int = 1) -> torch.Tensor:
        """`cp_rank`'s tokens of a full-window tensor, cut along `dim` (size `length`)."""
        if x.shape[dim] != self.length:
            raise ValueError(f"cannot shard a tensor of length {x.shape[dim]} along dim {dim}: "
                             f"the window length is {self.length}")
        a, b = self.chunks(cp_rank)
        c = self.chunk
        return torch.cat([x.narrow(dim, a * c, c), x.narrow(dim, b * c, c)], dim=dim)

    def unshard(self, parts: Sequence[torch.Tensor], dim: int = 1) -> torch.Tensor:
        """Inverse of `shard`: every rank's local tensor (in cp_rank order) back in window order."""
        if len(parts) != self.cp:
            raise ValueError(f"expected {self.cp} shards, got {len(parts)}")
        pieces: dict[int, torch.Tensor] = {}
        for r, part in enumerate(parts):
            a, b = self.chunks(r)
            pieces[a], pieces[b] = part.narrow(dim, 0, self.chunk), part.narrow(dim, self.chunk, self.chunk)
        return torch.cat([pieces[i] for i in range(2 * self.cp)], dim=dim)

    def shard_batch(self, batch: Mapping[str, torch.Tensor], cp_rank: int) -> dict[str, torch.Tensor]:
        """Shard every (B, L, ...) tensor of a batch along dim 1; other entries pass through unchanged."""
        out: dict[str, torch.Tensor] = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == self.length:
                out[k] = self.shard(v, cp_rank, dim=1)
            else:
                out[k] = v
        return out


def renumber_blocks(rows: torch.Tensor, seq_ids: torch.Tensor, n_k: int) -> torch.Tensor:
    """Global key-block ids (B, Hkv, nQ, W), -1 padded -> their positions in a key layout holding the blocks
    `seq_ids` (of `n_k` in the window), dropping ids not there; rows ascending, -1 padded, trimmed to the widest
    row (at least 1)."""
    pos_of = torch.full((n_k,), -1, dtype=torch.long, device=rows.device)
    pos_of[seq_ids.to(rows.device)] = torch.arange(seq_ids.numel(), device=rows.device)
    li = rows.long()
    pos = torch.where(li >= 0, pos_of[li.clamp(min=0)], -1)  # (B, Hkv, nQ, W)
    big = torch.iinfo(torch.long).max
    pos = torch.where(pos >= 0, pos, big).sort(dim=-1).values
    width = max(1, int((pos != big).sum(-1).max()))
    return torch.where(pos == big, -1, pos)[..., :width].to(torch.int32)
