"""The copy probe of effective context: a segment of a held-out window planted again D tokens later, the loss on
the second occurrence with and without the first, for D on a grid up to the window length. `make_probe` builds it
from the options, `run_probe` runs its planted windows through one model."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.losses import window_losses
from lcft.evaluate.stats import effective_context, mean_difference
from lcft.genomics.tokenizer import A, T, decode

if TYPE_CHECKING:
    from lcft.evaluate.parallel import EvalParallel
    from lcft.evaluate.store import LossStore
    from lcft.signals import StopSignals

VARIANTS = ("control", "exact", "mutated")
"""Windows built per (window, distance): the source shuffled (no copy), the exact copy, the mutated copy."""


def default_distances(length: int, segment: int) -> tuple[int, ...]:
    """Copy distances on a log grid: segment, 2 segment, 4 segment, ... below length - segment, then
    length - segment (the farthest a copy fits in the window)."""
    top = length - segment
    out, d = [], segment
    while d < top:
        out.append(d)
        d *= 2
    return (*out, top)


def check_probe(length: int, segment: int, distances: Sequence[int]) -> None:
    """The segment and every distance must fit the window: one-line LcftError otherwise."""
    if segment < 1:
        raise LcftError(f"--probe-segment must be at least 1, got {segment}")
    if 2 * segment > length:
        raise LcftError(f"--probe-segment {segment} is too long for {length}-token windows: a segment and its "
                        f"copy must both fit (at most {length // 2})")
    for d in distances:
        if d < segment:
            raise LcftError(f"probe distance {d} is shorter than the segment ({segment} tokens): the two "
                            "copies would overlap")
        if d > length - segment:
            raise LcftError(f"probe distance {d} is beyond the window: at most {length - segment} for "
                            f"{segment}-token segments in {length}-token windows")


@dataclass(frozen=True)
class Planted:
    """The windows of one (window, distance) probe. The target [target, target + segment) holds the source
    segment's original tokens in every variant; only the source [source, source + segment) differs."""

    window: int
    distance: int
    source: int
    target: int
    segment: int
    control: np.ndarray
    """(L,) token ids: the source segment shuffled (same bases, no copy to read back)."""
    exact: np.ndarray
    """(L,) token ids: the source segment as it was: an exact copy at `distance` before the target."""
    mutated: np.ndarray
    """(L,) token ids: the source segment with a fraction of its bases exchanged among themselves (a diverged
    repeat of the same base counts: `_mutate`)."""

    def decode(self, variant: str = "exact", softmask: np.ndarray | None = None) -> str:
        """The planted window as sequence text (upper case; lower case where `softmask` (L,) is True);
        single-base tokens (the char tokenizer)."""
        return decode(getattr(self, variant), softmask)

    def describe(self) -> dict[str, Any]:
        return {"window": self.window, "distance": self.distance, "segment": self.segment,
                "source": [self.source, self.source + self.segment],
                "target": [self.target, self.target + self.segment]}


def mutation_count(x: np.ndarray, frac: float) -> int:
    """How many of segment `x`'s A/C/G/T positions the mutated copy changes: round(frac * bases), lowered to the
    largest k whose positions can exchange their bases with none keeping its own, i.e. some k positions with each
    base on at most k // 2 of them (0 for a one-base segment; never 1; even where only two distinct bases are)."""
    counts = np.bincount(x[(x >= A) & (x <= T)] - A, minlength=4)  # (4,) A, C, G, T
    k = np.arange(int(round(frac * counts.sum())) + 1)  # (k + 1,) every count up to the one asked for
    return int(k[np.minimum(counts[:, None], k // 2).sum(0) >= k].max())  # k = 0 always qualifies


def _mutate(x: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
    """`x` with `mutation_count(x, frac)` of its A/C/G/T positions each given another base by exchanging the bases
    of those positions among them: the segment keeps its base counts, as the control (the source shuffled) does,
    so the mutated copy differs from the control in what it copies, not in composition. N and <unk> stay put."""
    out = x.copy()
    k = mutation_count(x, frac)
    if not k:
        return out
    order = rng.permutation(np.flatnonzero((x >= A) & (x <= T)))  # the base positions in a random order
    b = x[order].astype(np.int64) - A  # their bases 0..3
    rank = np.zeros(len(order), dtype=np.int64)  # each position's place among those of its base in `order`
    for base in range(4):
        rank[b == base] = np.arange(int((b == base).sum()))
    chosen = order[rank < k // 2][:k]  # (k,) each base on at most k // 2: enough of them by mutation_count
    # Sorted into blocks of one base (blocks in a random order), each base moved s places along, s between the
    # largest block m and k - m: a block of c <= m positions then lands wholly outside itself, so every chosen
    # position gets another base, and the bases are only moved, never made.
    key = np.argsort(rng.permutation(4))[x[chosen].astype(np.int64) - A]  # (k,) the rank of each one's block
    blocks = chosen[np.argsort(key, kind="stable")]  # (k,)
    m = int(np.bincount(key).max())
    out[np.roll(blocks, int(rng.integers(m, k - m + 1)))] = x[blocks]
    return out


def plant(ids: np.ndarray, window: int, segment: int, distance: int, mutation: float, seed: int) -> Planted:
    """The probe windows of window `ids` `(L,)` at one distance: the target is the window's last `segment`
    tokens, overwritten by the segment `distance` tokens earlier. Deterministic in (seed, window, distance)."""
    ids = np.asarray(ids)  # the split's token dtype is kept
    length = len(ids)
    target = length - segment
    source = target - distance
    x = ids[source:source + segment]  # (S,) the copied segment
    rng = np.random.default_rng([seed, window, distance])
    exact = ids.copy()
    exact[target:] = x
    control = exact.copy()
    control[source:source + segment] = rng.permutation(x)
    mutated = exact.copy()
    mutated[source:source + segment] = _mutate(x, mutation, rng)
    return Planted(window, distance, source, target, segment, control, exact, mutated)


class CopyProbe:
    """Every probe window of the first `n_windows` of `windows`, in a fixed order, and the accumulated loss on
    their target segments. Item k is one planted window (window-major, then distance, then variant)."""

    def __init__(self, windows: Any, n_windows: int, segment: int, distances: Sequence[int],
                 mutation: float, seed: int) -> None:
        self.windows, self.n_windows = windows, n_windows
        self.segment, self.distances = segment, tuple(int(d) for d in distances)
        self.mutation, self.seed = mutation, seed
        self.variants = VARIANTS if mutation > 0 else VARIANTS[:2]
        self.length = len(np.asarray(windows[0]))
        shape = (len(self.variants), n_windows, len(self.distances))
        self.sums = np.zeros(shape, dtype=np.float64)  # (variants, windows, distances) target loss sums
        self.counts = np.zeros(shape, dtype=np.int64)  # (variants, windows, distances) counted target tokens
        self._cache: tuple[tuple[int, int], Planted] | None = None

    def __len__(self) -> int:
        return self.n_windows * len(self.distances) * len(self.variants)

    def _locate(self, k: int) -> tuple[int, int, int]:
        nd, nv = len(self.distances), len(self.variants)
        return k // (nd * nv), (k // nv) % nd, k % nv

    def planted(self, window: int, d: int) -> Planted:
        """The probe windows of `window` at distance index `d` (kept for the next variant's item)."""
        if self._cache is None or self._cache[0] != (window, d):
            p = plant(np.asarray(self.windows[window]), window, self.segment, self.distances[d], self.mutation,
                      self.seed)
            self._cache = ((window, d), p)
        return self._cache[1]

    def planting(self) -> str:
        """sha256 of the first window's planted windows at every distance, and of a fixed all-base window planted
        the same way (the first window's sources may be N runs, which every rule leaves as they are): the kept
        losses of a stopped probe are read back only by a probe that plants as this one does (the same options
        under another planting rule give other windows)."""
        h = hashlib.sha256()
        for d in range(len(self.distances)):
            for v in self.variants:
                h.update(np.ascontiguousarray(getattr(self.planted(0, d), v)).tobytes())
        bases = np.random.default_rng(0).integers(A, T + 1, size=2 * self.segment, dtype=np.int64)  # (2S,) no N
        for v in self.variants:
            h.update(getattr(plant(bases, 0, self.segment, self.segment, self.mutation, self.seed), v).tobytes())
        return h.hexdigest()

    def __getitem__(self, k: int) -> np.ndarray:
        window, d, v = self._locate(k)
        return getattr(self.planted(window, d), self.variants[v])

    def first_position(self, max_context: int) -> int:
        """Start of the first piece the target's losses depend on under `max_context` (0 = whole window):
        positions before it can be left out of the forward pass without changing those losses."""
        if not max_context:
            return 0
        return ((self.length - self.segment - 1) // max_context) * max_context

    def record(self, k: int, loss: np.ndarray, counted: np.ndarray) -> None:
        """Add item k's per-token loss and counted, `(L,)` or any tail of the window (the target is its end)."""
        window, d, v = self._locate(k)
        m = np.asarray(counted[-self.segment:], dtype=bool)  # (S,) the target is the last S tokens
        self.sums[v, window, d] = float(np.asarray(loss[-self.segment:], dtype=np.float64)[m].sum())
        self.counts[v, window, d] = int(m.sum())

    def checked(self, label: str) -> CopyProbe:
        """This probe once every recorded target loss is finite; a one-line LcftError naming checkpoint `label`
        otherwise (a NaN would read as "no tokens" in every figure of it)."""
        if bad := sorted({int(w) for w in np.nonzero(~np.isfinite(self.sums))[1]}):
            raise LcftError(f"{label}: non-finite loss on the copy probe in {len(bad)} window(s) (first: window "
                            f"{bad[0]}): the model's weights or its training diverged")
        return self

    def summary(self, weights: np.ndarray) -> dict[str, Any]:
        """Loss drop by distance (control minus copy, nats/token; > 0 = the copy was read back) with bootstrap
        intervals under the window draw counts `weights` `(reps, n_windows)`, and the effective context (a
        sign-flip test over the windows, not the intervals: None when too few windows can tell)."""
        n = self.counts[0].sum(0)  # (distances,) the same target tokens in every variant
        with np.errstate(invalid="ignore", divide="ignore"):
            without = np.where(n > 0, self.sums[0].sum(0) / np.maximum(n, 1), np.nan)
        out: dict[str, Any] = {"distances": list(self.distances), "tokens": [int(c) for c in n],
                               "loss_without": _floats(without)}
        for v, name in enumerate(self.variants[1:], start=1):
            drop = mean_difference(self.sums[0], self.counts[0], self.sums[v], self.counts[v], weights,
                                   relative=False)
            rec = {"loss_with": _floats(without - drop.value), "drop": _floats(drop.value),
                   "ci_low": _floats(drop.low), "ci_high": _floats(drop.high),
                   "effective_context": effective_context(self.distances, (self.sums[0], self.counts[0]),
                                                          (self.sums[v], self.counts[v]), self.seed)}
            if name == "exact":
                out.update(rec)
            else:
                out[name] = {"fraction": self.mutation, **rec}
        return out


def _floats(x: np.ndarray) -> list[float | None]:
    """JSON-able list: NaN (no tokens) as None."""
    return [None if np.isnan(v) else float(v) for v in np.asarray(x, dtype=np.float64)]


def make_probe(cfg: EvalConfig, ws: Any, n_windows: int) -> CopyProbe | None:
    """A fresh copy probe over the first windows (None without --probe); bad sizes fail before any work."""
    if cfg.probe == "none":
        return None
    distances = cfg.probe_distances or default_distances(ws.length, cfg.probe_segment)
    check_probe(ws.length, cfg.probe_segment, distances)
    n = min(cfg.probe_windows or n_windows, n_windows)
    return CopyProbe(ws, n, cfg.probe_segment, distances, cfg.probe_mutation, cfg.seed)


def run_probe(model: torch.nn.Module, probe: CopyProbe, cfg: EvalConfig, max_context: int, device: torch.device,
              advance: Any = None, parallel: EvalParallel | None = None, store: LossStore | None = None,
              stop: StopSignals | None = None) -> None:
    """Every planted window of `probe` through one model, its target losses recorded in `probe` (and kept in
    `store`, whose items are its targets: `keep` = the segment). In one process a checkpoint cut to
    `max_context` runs only the pieces the target depends on."""
    first = probe.first_position(max_context) if parallel is None else 0  # cp shards need whole windows
    for k, loss_k, counted_k in window_losses(model, len(probe), lambda k: probe[k][first:], cfg, max_context,
                                              device, advance, parallel, store=store, stop=stop):
        probe.record(k, loss_k, counted_k)  # (L - first,) each, ending at the window end, where the target is
