"""Paired bootstrap over held-out windows: intervals of a checkpoint's change against the reference, and its trend;
and the sign-flip test behind the copy probe's effective context."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lcft.config import format_size
from lcft.units import counted

LEVEL = 0.95  # two-sided coverage of every interval in the report

GROWS = "the gain grows toward the end of the window"
SHRINKS = "the gain shrinks toward the end of the window"
NO_TREND = "no trend detectable at this sample size"
UNDEFINED = "undefined: fewer than 2 windows"
FLAT = "undefined: fewer than 2 position bins with tokens"
MIN_WINDOWS = 2  # a bootstrap over one window redraws that window every time: a zero-width interval, not a 95% one
FEW_WINDOWS = 20
"""Below this many windows a percentile interval holds the truth noticeably less often than LEVEL says: in
simulation (per-window noise, tests/evaluate/test_stats_coverage.py) about 76% of the time with 3 windows, 83%
with 5, 89% with 10, 93% from 20 windows on. The tables say their intervals are rough then."""


def resample_counts(n: int, reps: int, seed: int) -> np.ndarray:
    """(reps, n) int64: how often each of `n` windows is drawn in each of `reps` bootstrap replicates.

    Replicate r draws the windows `np.random.default_rng(seed).integers(0, n, size=(reps, n))[r]` (with
    replacement); every checkpoint, bin and subset is resampled with the same draws, so comparisons stay paired.
    """
    if n < 1 or reps < 1:
        raise ValueError(f"need n >= 1 windows and reps >= 1 replicates, got {n}, {reps}")
    draws = np.random.default_rng(seed).integers(0, n, size=(reps, n))  # (reps, n) window indices
    flat = (draws + n * np.arange(reps)[:, None]).ravel()  # (reps * n,) one slot per (replicate, window)
    return np.bincount(flat, minlength=reps * n).reshape(reps, n).astype(np.int64)


def _resampled(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Sums of per-window figures `x` `(n, ...)` under each replicate's draw counts `weights` `(reps, n)`."""
    return np.tensordot(weights.astype(np.float64), x.astype(np.float64), axes=1)  # (reps, ...)


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over axis 0 of bootstrap `samples` `(reps, ...)`, ignoring NaN replicates (a bin
    without tokens in that draw); NaN where every replicate is NaN."""
    tail = 100 * (1 - level) / 2
    flat = np.asarray(samples, dtype=np.float64).reshape(len(samples), -1)  # (reps, m)
    low, high = np.full(flat.shape[1], np.nan), np.full(flat.shape[1], np.nan)
    ok = ~np.all(np.isnan(flat), axis=0)  # (m,) columns with at least one defined replicate
    if ok.any():
        low[ok], high[ok] = np.nanpercentile(flat[:, ok], [tail, 100 - tail], axis=0)
    shape = np.shape(samples)[1:]
    return low.reshape(shape), high.reshape(shape)


@dataclass
class Change:
    """A change with its bootstrap interval, per column (bins, distances) or a scalar column (overall)."""

    value: np.ndarray
    """Point estimate from all windows (NaN where undefined)."""
    low: np.ndarray
    high: np.ndarray
    samples: np.ndarray
    """(reps, ...) the bootstrap replicates."""
    support: np.ndarray
    """(n, ...) bool: the windows with tokens in both means of each column (NaN low and high where fewer than
    MIN_WINDOWS)."""


def mean_difference(sums: np.ndarray, counts: np.ndarray, ref_sums: np.ndarray, ref_counts: np.ndarray,
                    weights: np.ndarray, *, relative: bool, level: float = LEVEL) -> Change:
    """Change of the token-weighted mean loss sum(sums) / sum(counts) against the reference's, from per-window
    loss sums and token counts `(n, ...)` of the same windows (a paired comparison: one draw resamples both).

    relative=True: mean / ref mean - 1; relative=False: mean - ref mean. Both means of a replicate come from
    the same arithmetic, so identical inputs give exactly zero in every replicate. A column with tokens in both
    means of fewer than MIN_WINDOWS windows has no interval (NaN low and high), its value stays.
    """
    def means(s: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, c = np.asarray(s, dtype=np.float64), np.asarray(c, dtype=np.float64)  # (n, ...)
        rs, rc = _resampled(weights, s), _resampled(weights, c)  # (reps, ...)
        with np.errstate(invalid="ignore", divide="ignore"):
            return s.sum(0) / c.sum(0), rs / rc  # NaN where there are no tokens

    (m, ms), (r, rs) = means(sums, counts), means(ref_sums, ref_counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        value, samples = (m / r - 1, ms / rs - 1) if relative else (m - r, ms - rs)
    low, high = percentile_interval(samples, level)
    support = (np.asarray(counts) > 0) & (np.asarray(ref_counts) > 0)  # (n, ...)
    few = support.sum(0) < MIN_WINDOWS  # (...)
    low, high = np.where(few, np.nan, low), np.where(few, np.nan, high)
    return Change(np.asarray(value), low, high, samples, support)


@dataclass
class Trend:
    """Slope of the relative change against log2 position (per doubling of position), with its interval."""

    slope: float
    low: float
    high: float
    verdict: str


def _weighted_slope(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares slope of y on x along the last axis; y, w `(..., k)`, x `(k,)`. NaN if undefined."""
    w = np.where(np.isnan(y), 0.0, w)
    y = np.where(np.isnan(y), 0.0, y)
    sw = w.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        xm = (w * x).sum(-1) / sw  # (...)
        ym = (w * y).sum(-1) / sw
        dx = x - xm[..., None]  # (..., k)
        sxx = (w * dx * dx).sum(-1)
        sxy = (w * dx * (y - ym[..., None])).sum(-1)
        return np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), np.nan)


def verdict(low: float, high: float) -> str:
    """One line from the slope's interval: a falling relative change (more gain later in the window) grows."""
    if high < 0:
        return GROWS
    if low > 0:
        return SHRINKS
    return NO_TREND


def bin_positions(edges: np.ndarray) -> np.ndarray:
    """(k,) representative position of each bin on a log axis: geometric mean of its ends (position 0 as 1)."""
    e = np.asarray(edges, dtype=np.float64)
    return np.sqrt(np.maximum(e[:-1], 1.0) * np.maximum(e[1:], 1.0))


def trend(change: Change, counts: np.ndarray, weights: np.ndarray, positions: np.ndarray,
          level: float = LEVEL) -> Trend:
    """Slope of a per-bin relative `change` against log2 `positions` `(k,)`, each bin weighted by its tokens
    (`counts` `(n, k)`; resampled with the same `weights` `(reps, n)` as the change's replicates). No interval
    and an undefined verdict when fewer than MIN_WINDOWS windows have tokens (in both means) in any bin, or
    when fewer than 2 bins have a change (a single bin has no slope, however many windows there are)."""
    x = np.log2(np.asarray(positions, dtype=np.float64))  # (k,)
    n_tok = np.asarray(counts, dtype=np.float64)  # (n, k)
    slope = float(_weighted_slope(x, np.asarray(change.value, dtype=np.float64), n_tok.sum(0)))
    if math.isnan(slope):  # bins have distinct positions, so only fewer than 2 bins with a change leave it undefined
        return Trend(slope, math.nan, math.nan, FLAT)
    if int(np.asarray(change.support).any(-1).sum()) < MIN_WINDOWS:
        return Trend(slope, math.nan, math.nan, UNDEFINED)
    samples = _weighted_slope(x, change.samples, _resampled(weights, n_tok))  # (reps,)
    low, high = (float(v) for v in percentile_interval(samples, level))
    if math.isnan(low):
        return Trend(slope, low, high, NO_TREND)
    return Trend(slope, low, high, verdict(low, high))


EXACT_WINDOWS = 16
"""Up to this many windows the sign-flip test enumerates all 2^n swaps (65,536 at 16); beyond, it draws FLIPS."""
FLIPS = 9999
"""Random swap patterns of the sign-flip test beyond EXACT_WINDOWS: p-values resolve down to 1 / (1 + FLIPS)."""
NO_PROBE = "not measured (no copy probe)"
"""How an effective context reads where the copy probe did not run (eval.json: it and `probe` are null)."""


def context_text(d: int | None, windows: int | None) -> str:
    """An effective context as the tables and summaries name it: its size, none detected (0), cannot tell (None
    from a probe of `windows` windows: too few of them hold tokens at the distances for any pattern to pass the
    test over them; N runs at the sources can leave fewer windows than were probed), or NO_PROBE
    (`windows` None: the probe did not run, which eval.json also writes as a null effective context)."""
    if windows is None:
        return NO_PROBE
    if d is None:
        return f"cannot tell (too few with tokens of {counted(windows, 'probe window')})"
    return format_size(d) if d else "none detected"


def _flip_statistics(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
                     swaps: np.ndarray) -> np.ndarray:
    """(P, m) token-weighted mean of variant `a` minus that of `b` (each (sums, counts) `(n, m)`) with the windows
    marked in `swaps` `(P, n)` (1 = swap) exchanged between the variants, sums and counts alike."""
    (a_s, a_c), (b_s, b_c) = a, b
    ds, dc = swaps @ (b_s - a_s), swaps @ (b_c - a_c)  # (P, m) what the swapped windows move from b to a
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a_s.sum(0) + ds) / (a_c.sum(0) + dc) - (b_s.sum(0) - ds) / (b_c.sum(0) - dc)


def flip_pvalues(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
                 seed: int = 0) -> np.ndarray:
    """(m,) one-sided p-values of "variant `a`'s mean is not above `b`'s" per column, from per-window loss sums and
    token counts `(n, m)` of each variant: the share of swap patterns (a window's two variants exchanged) whose
    statistic is at least the observed one, the observed pattern included. Exact over all 2^n patterns up to
    EXACT_WINDOWS windows, else (1 + k) / (1 + FLIPS) over FLIPS patterns drawn with `seed`. NaN for a column
    without tokens."""
    a = tuple(np.asarray(x, dtype=np.float64) for x in a)
    b = tuple(np.asarray(x, dtype=np.float64) for x in b)
    n = a[0].shape[0]
    observed = _flip_statistics(a, b, np.zeros((1, n)))[0]  # (m,) through the same arithmetic as every pattern
    # patterns equal in exact arithmetic may differ in the last bits: count those as ties, not as smaller
    with np.errstate(invalid="ignore", divide="ignore"):
        tol = 1e-9 * (np.abs(a[0].sum(0) / a[1].sum(0)) + np.abs(b[0].sum(0) / b[1].sum(0)) + 1)  # (m,)
    exact = n <= EXACT_WINDOWS
    total = 2 ** n if exact else FLIPS
    rng = np.random.default_rng(seed)
    hits = np.zeros_like(observed)  # (m,) patterns at least as extreme as the observed one
    chunk = max(1, 2 ** 20 // max(n, 1))  # patterns per block: a few MB at a time
    for start in range(0, total, chunk):
        rows = np.arange(start, min(start + chunk, total))
        swaps = ((rows[:, None] >> np.arange(n)) & 1 if exact else
                 rng.integers(0, 2, size=(len(rows), n)))  # (P, n)
        stats = _flip_statistics(a, b, swaps.astype(np.float64))  # (P, m)
        hits += (~(stats < observed - tol)).sum(0)  # NaN (a pattern leaving a variant no tokens) counts as extreme
    p = hits / total if exact else (1 + hits) / (1 + FLIPS)
    return np.where((a[1].sum(0) > 0) & (b[1].sum(0) > 0), p, np.nan)


def smallest_pvalue(windows: int) -> float:
    """The smallest p-value `flip_pvalues` can give from `windows` windows: one pattern in 2^n, or one plus none
    of the drawn patterns."""
    return 2.0 ** -windows if windows <= EXACT_WINDOWS else max(2.0 ** -windows, 1 / (1 + FLIPS))


def effective_context(distances: list[int] | np.ndarray, control: tuple[np.ndarray, np.ndarray],
                      copy: tuple[np.ndarray, np.ndarray], seed: int = 0, level: float = LEVEL) -> int | None:
    """The largest copy distance whose loss drop (control minus copy, one column per distance of the per-window
    loss sums and token counts `(n, distances)` of each variant) is above zero with the distances tested together
    (Holm's step-down over sign-flip p-values at the intervals' low-end error, over the distances with windows
    enough to pass it); 0 when none is; None when too few windows could show any distance at that error (cannot
    tell)."""
    # When the target's loss does not depend on the order of the source's bases (no copy read back, and no use of
    # its k-mer statistics either: the control shuffles the source's bases) a window's two variants are
    # exchangeable, so swapping them (a sign flip of its drop when both count the same tokens) gives an exact null;
    # a bootstrap p-value is not one with few windows (all of n windows dropping the same way, as 2^-n of null runs
    # do, gave p = 1 / (1 + reps): with 4 windows 37 to 44% of null runs claimed a context). Each distance alone would claim one in most null runs, so the claim "drop above
    # zero" is held at the error of one interval's low end, (1 - level) / 2, over the whole family of distances with
    # tokens: Holm, not Bonferroni, the same bound and it finds more. Not "every distance up to D": a model may read
    # back one distance only (the demo's positive control reads half its window back, by position, and nothing
    # 256 tokens back).
    (c_s, c_c), (k_s, k_c) = (tuple(np.asarray(x, dtype=np.float64) for x in v) for v in (control, copy))
    p = flip_pvalues((c_s, c_c), (k_s, k_c), seed)  # (distances,)
    alpha = (1 - level) / 2
    windows = (c_c + k_c > 0).sum(0)  # (distances,) windows with tokens: the only ones whose swap moves the drop
    floor = np.array([smallest_pvalue(int(w)) for w in windows])  # (distances,) the smallest p each can reach
    tested = np.flatnonzero(~np.isnan(p))  # distances with a drop (tokens in both variants)
    # Tarone: a distance whose smallest p cannot pass alpha / m (too few windows with tokens there, e.g. N runs at
    # its sources) could never be claimed, so it leaves the family rather than lower every other one's bar;
    # repeated, since a smaller family lowers the bar it is measured against
    while len(tested) and (floor[tested] >= alpha / len(tested)).any():
        tested = tested[floor[tested] < alpha / len(tested)]
    m = len(tested)
    if not m:
        return None  # not even the most extreme drop could pass at any distance: no answer, not "none"
    above: list[int] = []
    for rank, j in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        if not p[j] < alpha / (m - rank):
            break
        above.append(int(np.asarray(distances)[j]))
    return max(above, default=0)
