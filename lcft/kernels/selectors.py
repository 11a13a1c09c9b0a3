"""Key-block selectors: the `Selector` interface, a registry by name, and the default block-mean selector.

A selector works in two steps, so that context parallelism can split it over ranks: `summarise` turns each key
block into a summary computed from that block's keys alone (a rank summarises its own keys and the summaries are
exchanged), and `select` picks, for query blocks starting at a global block offset, which key blocks they read.
"""

from __future__ import annotations

from typing import Protocol

import torch

from lcft.errors import LcftError
from lcft.kernels.selection import block_means, select_blocks_torch
from lcft.kernels.spec import SparseSpec


class Selector(Protocol):
    """Chooses the key blocks of each query block. Both methods run without gradient."""

    def summarise(self, k: torch.Tensor, spec: SparseSpec) -> torch.Tensor:
        """Keys (B, Hkv, Lk, D) -> one summary per key block (B, Hkv, Lk/block, ...). A block's summary must
        depend on that block's keys only: context parallelism summarises each rank's keys and concatenates."""
        ...

    def select(self, q: torch.Tensor, summary: torch.Tensor, spec: SparseSpec, q_block_offset: int
               ) -> torch.Tensor:
        """Queries (B, Hq, Lq, D) of the query blocks starting at global block `q_block_offset`, and the window's
        key-block summaries from block 0 (at least up to the last query block) -> (B, Hkv, Lq/block, W) int32
        global key-block ids: each row ascending, -1 padded, holding its own block and no later one."""
        ...


# Optional selector attribute: `dense_within_budget = True` when a budget that covers every earlier key block
# means every earlier block is chosen; `sparse_attention` then runs dense attention instead (identical result).

_SELECTORS: dict[str, type] = {}


def register_selector(name: str, cls: type) -> None:
    """Make `cls` (constructed without arguments, following `Selector`) available as SparseSpec.selector=name."""
    known = _SELECTORS.get(name)
    if known is not None and known is not cls:
        raise ValueError(f"selector name {name!r} is already taken by {known.__qualname__}")
    _SELECTORS[name] = cls


def get_selector(name: str) -> Selector:
    """The registered selector called `name`; LcftError listing the known names otherwise."""
    cls = _SELECTORS.get(name)
    if cls is None:
        raise LcftError(f"unknown block selector {name!r}; known: {', '.join(sorted(_SELECTORS))}")
    return cls()


class BlockMeanSelector:
    """The default selector ("block_mean", see the module doc): the Triton kernel on CUDA, chunked PyTorch
    elsewhere (both pick the same ids, ties to the lower block)."""

    dense_within_budget = True
    """When the budget covers every earlier block, every earlier block is chosen (callers may run dense)."""

    def summarise(self, k: torch.Tensor, spec: SparseSpec) -> torch.Tensor:
        """Key-block means in fp32: (B, Hkv, Lk, D) -> (B, Hkv, nK, D)."""
        with torch.no_grad():
            return block_means(k, spec.block_size)

    def select(self, q: torch.Tensor, summary: torch.Tensor, spec: SparseSpec, q_block_offset: int
               ) -> torch.Tensor:
        """(B, Hq, Lq, D) queries, (B, Hkv, nK, D) means -> (B, Hkv, nQ, budget) int32 ids."""
        if q.is_cuda:
            from lcft.kernels.selection_triton import select_blocks_triton

            return select_blocks_triton(q, summary, spec, q_block_offset)
        return select_blocks_torch(q, summary, spec, q_block_offset)


register_selector("block_mean", BlockMeanSelector)
