"""Position bins over a window and the reduction of per-position loss sums to per-bin and per-range means."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lcft.evaluate.config import BinScale
from lcft.units import LN2

UNIFORM_LOSS = math.log(4.0)  # nats per base of a uniform guess over A, C, G, T (= 2 bits/base)
UNIFORM_BITS = UNIFORM_LOSS / LN2  # the same in bits per base: 2
THIN = 0.5
"""A position bin with tokens of fewer than this share of the windows is flagged: with --position bases and a
model tokenizer the windows span different numbers of bases and the bins span the longest, so the last bins
average the few windows that reach them, mixing position with which windows are averaged."""


def thin_bins(windows: list[int] | np.ndarray, n: int) -> np.ndarray:
    """(k,) bool: the bins whose tokens come from fewer than THIN of the `n` windows (`windows` `(k,)`: how
    many windows have counted tokens in each bin)."""
    return np.asarray(windows, dtype=np.int64) < THIN * n


def bin_edges(length: int, bins: int, scale: BinScale = "linear") -> np.ndarray:
    """Integer edges `e` (int64, increasing, e[0] = 0, e[-1] = length): bin b holds positions e[b] <= p < e[b+1].

    Linear bins have equal widths (up to rounding). Log bins grow geometrically from position 1. On both
    scales position 0 (which predicts nothing) shares the first bin with position 1, so every bin holds a
    predicted position. Edges that round to the same integer are merged, so short windows (or many bins) may
    get fewer bins than asked for.
    """
    if length < 1 or bins < 1:
        raise ValueError(f"need length >= 1 and bins >= 1, got {length}, {bins}")
    if scale == "linear":
        raw = np.linspace(0, length, bins + 1)
    elif scale == "log":
        raw = np.geomspace(1, length, bins + 1)
        raw[0] = 0
    else:
        raise ValueError(f"unknown bin scale {scale!r} (linear or log)")  # a caller's contract: configs check it once
    edges = np.unique(np.rint(raw).astype(np.int64))
    edges[0], edges[-1] = 0, length
    if len(edges) > 2 and edges[1] == 1:  # a bin [0, 1) would hold only position 0: always empty
        edges = np.delete(edges, 1)
    return edges


@dataclass
class PositionSums:
    """Loss sums and token counts per position of the window, accumulated over windows (fp64, exact sums)."""

    loss_sum: np.ndarray
    """(L,) float64: summed per-token loss of the token at each position."""
    count: np.ndarray
    """(L,) int64: how many tokens were counted at each position (N positions and position 0 are not)."""
    bases: np.ndarray
    """(L,) int64: bases of the counted tokens at each position (= count for char)."""

    @classmethod
    def zeros(cls, length: int) -> PositionSums:
        return cls(np.zeros(length, dtype=np.float64), np.zeros(length, dtype=np.int64),
                   np.zeros(length, dtype=np.int64))

    def add(self, loss: np.ndarray, mask: np.ndarray, bases: np.ndarray | None = None) -> None:
        """Add one window's per-token loss `(L,)` at the positions where `mask` `(L,)` is True; `bases` `(L,)`:
        the bases of the token at each position (None: one each)."""
        self.loss_sum += np.where(mask, loss, 0.0)
        self.count += mask
        self.bases += mask if bases is None else np.where(mask, bases, 0)

    def total(self) -> tuple[float, int]:
        return float(self.loss_sum.sum()), int(self.count.sum())

    def mean(self) -> float:
        s, n = self.total()
        return s / n if n else math.nan

    def binned(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-bin mean loss (NaN for a bin without tokens) and token count, for the bins given by `edges`."""
        starts = edges[:-1]
        sums = np.add.reduceat(self.loss_sum, starts)  # (nbins,)
        counts = np.add.reduceat(self.count, starts)  # (nbins,)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return means, counts

    def binned_bits_per_base(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-bin bits per base (nats summed over the bin / bases of its counted tokens / ln 2; NaN without
        tokens) and bases, for the bins given by `edges`."""
        sums = np.add.reduceat(self.loss_sum, edges[:-1])  # (nbins,) the same sums as `binned`
        bases = np.add.reduceat(self.bases, edges[:-1])  # (nbins,)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bases > 0, sums / np.maximum(bases, 1) / LN2, np.nan), bases

    def range_mean(self, start: int, end: int) -> float:
        """Mean loss over positions start <= p < end (token-count weighted); NaN without tokens."""
        n = int(self.count[start:end].sum())
        return float(self.loss_sum[start:end].sum()) / n if n else math.nan


SUBSETS = ("all", "repeat", "unique", "recurring", "nonrecurring")
"""Token subsets of the per-window bin sums: every counted token; soft-masked (lower-case, RepeatMasker
repeat) predicted bases and upper-case ones; tokens whose k-mer occurred earlier in the window (see
lcft.evaluate.recurrence) and the others."""


class WindowBins:
    """Loss sums and token counts per position bin of each window, in window order, for every counted token,
    split by the soft-mask bit of the predicted base and by in-window recurrence (the figures the bootstrap
    resamples)."""

    def __init__(self, edges: np.ndarray) -> None:
        self.starts = np.asarray(edges[:-1], dtype=np.int64)
        self._loss: list[np.ndarray] = []
        self._count: list[np.ndarray] = []
        self._bases: list[np.ndarray] = []

    def add(self, loss: np.ndarray, counted: np.ndarray, softmask: np.ndarray | None,
            bases: np.ndarray | None = None, recur: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Add one window: per-token loss `(L,)`, counted `(L,)` bool, soft-mask bit of each position `(L,)`
        (None: no soft mask, every base counts as unique), bases of the token at each position `(L,)` (None:
        one each), nearest-copy distance of each position `(L,)` (> 0 = recurring; None: none recurs).
        Returns its (subsets, bins) loss sums and counts."""
        counted = np.asarray(counted, dtype=bool)
        soft = np.zeros_like(counted) if softmask is None else np.asarray(softmask, dtype=bool)
        again = np.zeros_like(counted) if recur is None else np.asarray(recur) > 0  # (L,)
        loss64 = np.asarray(loss, dtype=np.float64)  # (L,) sums in fp64, as PositionSums
        per = np.ones(counted.shape, dtype=np.int64) if bases is None else np.asarray(bases, dtype=np.int64)  # (L,)
        masks = (counted, counted & soft, counted & ~soft, counted & again, counted & ~again)  # SUBSETS order
        self._loss.append(np.stack([np.add.reduceat(np.where(m, loss64, 0.0), self.starts) for m in masks]))
        self._count.append(np.stack([np.add.reduceat(m.astype(np.int64), self.starts) for m in masks]))
        self._bases.append(np.stack([np.add.reduceat(np.where(m, per, 0), self.starts) for m in masks]))
        return self._loss[-1], self._count[-1]

    def __len__(self) -> int:
        return len(self._loss)

    @property
    def loss(self) -> np.ndarray:
        """(windows, subsets, bins) float64 loss sums."""
        k = len(self.starts)
        return np.stack(self._loss) if self._loss else np.zeros((0, len(SUBSETS), k))

    @property
    def count(self) -> np.ndarray:
        """(windows, subsets, bins) int64 token counts."""
        k = len(self.starts)
        return np.stack(self._count) if self._count else np.zeros((0, len(SUBSETS), k), dtype=np.int64)

    @property
    def windows(self) -> np.ndarray:
        """(bins,) int64: how many windows have counted tokens in each bin."""
        return (self.count[:, 0] > 0).sum(0).astype(np.int64)

    @property
    def bases(self) -> np.ndarray:
        """(windows, subsets, bins) int64 bases of the counted tokens."""
        k = len(self.starts)
        return np.stack(self._bases) if self._bases else np.zeros((0, len(SUBSETS), k), dtype=np.int64)


def at_base_offsets(length: int, offsets: np.ndarray, counted: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per-token `values` `(L,)` of the counted tokens at the base offset of their first base (`offsets`
    `(L,)`), zero (False) at every other base position: `(length,)` of the values' dtype."""
    out = np.zeros(length, dtype=np.asarray(values).dtype)  # (length,)
    out[np.asarray(offsets)[counted]] = np.asarray(values)[counted]
    return out


def to_base_positions(length: int, offsets: np.ndarray, loss: np.ndarray, counted: np.ndarray,
                      softmask: np.ndarray | None, bases: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """One window's per-token arrays `(L,)` moved to base positions `(length,)`: each counted token's loss,
    counted bit, soft-mask bit and bases at the base offset of its first base (`offsets` `(L,)`), every other
    base position uncounted. A counted token covers at least one base, so no two share an offset."""
    counted = np.asarray(counted, dtype=bool)
    out_loss = at_base_offsets(length, offsets, counted, np.asarray(loss, dtype=np.float64))  # (length,)
    out_counted = at_base_offsets(length, offsets, counted, counted)  # (length,)
    out_bases = at_base_offsets(length, offsets, counted, np.asarray(bases, dtype=np.int64))  # (length,)
    out_soft = None
    if softmask is not None:
        out_soft = at_base_offsets(length, offsets, counted, np.asarray(softmask, dtype=bool))  # (length,)
    return out_loss, out_counted, out_soft, out_bases


def tenths(length: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Position ranges of the first and the last tenth of a window: [0, L/10) and [L - L/10, L), each at least
    one position; the first reaches position 1 at least, since position 0 predicts nothing (a window under 20
    tokens would have no first-tenth figure)."""
    tenth = max(1, length // 10)
    return (0, min(length, max(2, tenth))), (length - tenth, length)


def relative_change(values: np.ndarray | float, reference: np.ndarray | float) -> np.ndarray | float:
    """(value - reference) / reference; negative = lower loss than the reference. NaN where undefined."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (np.asarray(values, dtype=np.float64) - reference) / np.asarray(reference, dtype=np.float64)
    return float(out) if np.ndim(out) == 0 else out
