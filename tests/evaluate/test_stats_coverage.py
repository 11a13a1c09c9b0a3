"""Coverage of the bootstrap intervals on synthetic windows whose true change is known: a 95% interval holds the
truth in about 95% of repeated evaluations (binomial tolerance), for the change and for its trend."""

from __future__ import annotations

import math

import numpy as np

from lcft.evaluate.binning import bin_edges
from lcft.evaluate.stats import LEVEL, bin_positions, mean_difference, resample_counts, trend

REPS, WINDOWS, BOOTSTRAP = 1000, 40, 400
SHORTFALL = 0.025  # a percentile interval from 40 windows covers about 1.5 points less (0.935 in 3,000 runs)


def _covers_at_level(hits: int) -> bool:
    """`hits` of REPS intervals holding the truth is within 3.5 binomial standard deviations of LEVEL, allowing
    below it for the percentile interval's small-sample SHORTFALL: a 90% interval, or a too wide (unpaired) one
    covering nearly always, falls outside."""
    sd = math.sqrt(LEVEL * (1 - LEVEL) / REPS)
    return LEVEL - SHORTFALL - 3.5 * sd <= hits / REPS <= LEVEL + 3.5 * sd


def _windows(rng: np.random.Generator, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loss sums of a reference and of a checkpoint whose expected relative change in each bin is `rel` `(k,)`:
    windows differ in token counts and in loss level (shared by both checkpoints, so the pairing matters),
    and the change carries per-window noise of mean zero."""
    k = len(rel)
    counts = rng.integers(100, 300, size=(WINDOWS, k))  # (n, k)
    level = 1.3 + rng.normal(0, 0.15, size=(WINDOWS, 1)) + rng.normal(0, 0.05, size=(WINDOWS, k))  # (n, k)
    ref = counts * level
    return ref * (1 + rel + rng.normal(0, 0.03, size=(WINDOWS, k))), ref, counts


def test_the_interval_of_a_change_covers_the_truth_at_its_level():
    rng = np.random.default_rng(0)
    truth, hits, widths = -0.01, 0, []
    for r in range(REPS):
        other, ref, counts = _windows(rng, np.array([truth]))
        c = mean_difference(other[:, 0], counts[:, 0], ref[:, 0], counts[:, 0], resample_counts(WINDOWS, BOOTSTRAP, r),
                            relative=True)
        hits += bool(c.low <= truth <= c.high)
        widths.append(float(c.high - c.low))
    assert _covers_at_level(hits), hits / REPS
    # Paired: the windows' shared loss level (sd 0.15 of 1.3) cancels; an unpaired interval would be ~4x wider.
    assert np.median(widths) < 4 * 1.96 * 0.03 / math.sqrt(WINDOWS)


def test_the_interval_of_a_trend_covers_the_true_slope_at_its_level():
    edges = bin_edges(4096, 8, "log")
    positions = bin_positions(edges)
    x = np.log2(positions)  # (k,)
    slope = -0.004  # change per doubling of position: the gain grows toward the end of the window
    rng, hits = np.random.default_rng(1), 0
    for r in range(REPS):
        other, ref, counts = _windows(rng, 0.01 + slope * (x - x.mean()))
        w = resample_counts(WINDOWS, BOOTSTRAP, r)
        t = trend(mean_difference(other, counts, ref, counts, w, relative=True), counts, w, positions)
        hits += t.low <= slope <= t.high
    assert _covers_at_level(hits), hits / REPS
