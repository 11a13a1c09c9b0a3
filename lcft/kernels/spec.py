"""`SparseSpec`: the one description of block-sparse attention, passed whole to kernels, selectors and CP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lcft.errors import LcftError, shown

AttentionImpl = Literal["auto", "reference", "cpu", "triton"]  # the sparse kernels' implementations
MAX_BLOCKS = 1 << 20  # a block's tokens, or blocks attended: one block of the longest sequence lcft trains on


@dataclass(frozen=True)
class SparseSpec:
    """Which key blocks each query block reads (docs/design.md, Sparse attention); saved in lcft.json."""

    block_size: int = 64
    """Tokens per block: the unit of selection and of the attention kernels (64 on CPU, 128 on GPU)."""
    top_k: int = 16
    """Key blocks the selector picks for each query block, besides its own, local and sink blocks."""
    local_blocks: int = 1
    """Key blocks immediately before each query block that are always attended."""
    sink_blocks: int = 1
    """First key blocks of the sequence that are always attended (attention sinks)."""
    selector: str = "block_mean"
    """Name of the block selector (lcft.kernels.selectors registry): block_mean = top-k by the dot product
    of the query block's mean with each key block's mean."""

    def __post_init__(self) -> None:  # read from lcft.json too: each a whole number, bounded, before any use
        for name in ("block_size", "top_k", "local_blocks", "sink_blocks"):
            v, low = getattr(self, name), 1 if name == "block_size" else 0
            if type(v) is not int or not low <= v <= MAX_BLOCKS:
                raise LcftError(f"{name} must be a whole number from {low} to {MAX_BLOCKS}, got {shown(v, quoted=True)}")
        if not isinstance(self.selector, str):
            raise LcftError(f"selector must be a name, got {shown(self.selector, quoted=True)}")

    @property
    def budget(self) -> int:
        """Key blocks attended per query block (the width of the index rows): top_k + local + sink + own."""
        return self.top_k + self.local_blocks + self.sink_blocks + 1
