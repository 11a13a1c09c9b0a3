"""Paired bootstrap, trend and per-window bin sums on synthetic figures, against direct numpy computations."""

from __future__ import annotations

import numpy as np
import pytest

from lcft.evaluate.binning import SUBSETS, WindowBins, bin_edges
from lcft.evaluate.stats import (
    GROWS,
    NO_TREND,
    SHRINKS,
    bin_positions,
    effective_context,
    mean_difference,
    resample_counts,
    trend,
)


def _figures(n: int = 14, k: int = 6, seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-window, per-bin loss sums of a reference and a second checkpoint over the same token counts."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(50, 200, size=(n, k))  # (n, k)
    ref = counts * rng.uniform(1.2, 1.4, size=(n, k))  # (n, k) mean loss ~1.3 nats
    other = ref * rng.uniform(0.95, 1.03, size=(n, k))
    return ref, other, counts


def _direct_bootstrap(ref, other, counts, reps, seed, relative=True):
    """The textbook loop: draw windows with replacement, recompute both means from the drawn windows."""
    draws = np.random.default_rng(seed).integers(0, len(ref), size=(reps, len(ref)))
    out = []
    for idx in draws:
        m_other = other[idx].sum(0) / counts[idx].sum(0)
        m_ref = ref[idx].sum(0) / counts[idx].sum(0)
        out.append(m_other / m_ref - 1 if relative else m_other - m_ref)
    out = np.array(out)  # (reps, ...)
    return np.percentile(out, 2.5, axis=0), np.percentile(out, 97.5, axis=0)


def test_resample_counts_are_the_seeded_draws():
    w = resample_counts(9, 50, seed=7)
    draws = np.random.default_rng(7).integers(0, 9, size=(50, 9))
    assert w.shape == (50, 9) and (w.sum(1) == 9).all()
    assert all((np.bincount(d, minlength=9) == row).all() for d, row in zip(draws, w, strict=True))
    assert (resample_counts(9, 50, seed=7) == w).all() and not (resample_counts(9, 50, seed=8) == w).all()


@pytest.mark.parametrize("relative", [True, False])
def test_intervals_match_a_direct_bootstrap_per_bin_and_overall(relative):
    ref, other, counts = _figures()
    w = resample_counts(len(ref), 400, seed=5)
    per_bin = mean_difference(other, counts, ref, counts, w, relative=relative)
    lo, hi = _direct_bootstrap(ref, other, counts, 400, 5, relative)
    np.testing.assert_allclose(per_bin.low, lo, rtol=1e-9)
    np.testing.assert_allclose(per_bin.high, hi, rtol=1e-9)
    m_other, m_ref = other.sum(0) / counts.sum(0), ref.sum(0) / counts.sum(0)
    np.testing.assert_allclose(per_bin.value, m_other / m_ref - 1 if relative else m_other - m_ref, rtol=1e-12)
    overall = mean_difference(other.sum(1), counts.sum(1), ref.sum(1), counts.sum(1), w, relative=relative)
    lo, hi = _direct_bootstrap(ref.sum(1), other.sum(1), counts.sum(1), 400, 5, relative)
    assert overall.low.shape == () and overall.low == pytest.approx(lo, rel=1e-9)
    assert overall.high == pytest.approx(hi, rel=1e-9)
    assert overall.low <= overall.value <= overall.high


def test_identical_inputs_give_a_zero_width_interval_at_zero():
    ref, _, counts = _figures()
    c = mean_difference(ref.copy(), counts, ref, counts, resample_counts(len(ref), 200, seed=0), relative=True)
    assert (c.value == 0).all() and (c.low == 0).all() and (c.high == 0).all()


def test_same_seed_same_interval_other_seed_another():
    ref, other, counts = _figures()
    a = mean_difference(other, counts, ref, counts, resample_counts(len(ref), 300, seed=1), relative=True)
    b = mean_difference(other, counts, ref, counts, resample_counts(len(ref), 300, seed=1), relative=True)
    c = mean_difference(other, counts, ref, counts, resample_counts(len(ref), 300, seed=2), relative=True)
    assert (a.low == b.low).all() and (a.high == b.high).all()
    assert not (a.low == c.low).all()


def test_a_bin_without_tokens_has_no_interval():
    ref, other, counts = _figures()
    for x in (ref, other, counts):
        x[:, 2] = 0
    c = mean_difference(other, counts, ref, counts, resample_counts(len(ref), 100, seed=0), relative=True)
    assert np.isnan(c.value[2]) and np.isnan(c.low[2]) and np.isnan(c.high[2])
    assert not np.isnan(c.low[[0, 1, 3]]).any()


def _trended(slope: float, noise: float, seed: int = 0):
    """Per-window sums whose relative change moves by `slope` per doubling of position over log bins."""
    rng = np.random.default_rng(seed)
    edges = bin_edges(4096, 12, "log")
    x = np.log2(bin_positions(edges))  # (k,)
    n, k = 40, len(x)
    counts = np.tile(np.diff(edges), (n, 1))  # (n, k) every window fully counted
    ref = counts * 1.3
    rel = slope * (x - x.mean()) + rng.normal(0, noise, size=(n, k))  # (n, k)
    return ref * (1 + rel), ref, counts, edges


@pytest.mark.parametrize("slope,expect", [(-0.004, GROWS), (0.004, SHRINKS), (0.0, NO_TREND)])
def test_trend_verdict_follows_the_slope_interval(slope, expect):
    other, ref, counts, edges = _trended(slope, noise=0.01)
    w = resample_counts(len(ref), 500, seed=0)
    t = trend(mean_difference(other, counts, ref, counts, w, relative=True), counts, w, bin_positions(edges))
    assert t.verdict == expect and t.low <= t.slope <= t.high
    # The point slope is the token-weighted least-squares fit (numpy's polyfit weights are sqrt of ours).
    rel = other.sum(0) / ref.sum(0) - 1
    fit = np.polyfit(np.log2(bin_positions(edges)), rel, 1, w=np.sqrt(counts.sum(0)))[0]
    assert t.slope == pytest.approx(fit, rel=1e-9, abs=1e-12)


def test_trend_of_identical_checkpoints_is_zero_with_no_verdict():
    _, ref, counts, edges = _trended(0.0, 0.0)
    w = resample_counts(len(ref), 100, seed=0)
    t = trend(mean_difference(ref.copy(), counts, ref, counts, w, relative=True), counts, w, bin_positions(edges))
    assert t.slope == 0 and t.low == 0 and t.high == 0 and t.verdict == NO_TREND


def test_effective_context_is_the_farthest_distance_above_zero():
    assert effective_context([256, 512, 1024, 2048], np.array([0.3, 0.1, -0.01, 0.02])) == 2048
    assert effective_context([256, 512, 1024], np.array([0.3, 0.0, np.nan])) == 256
    assert effective_context([256, 512], np.array([0.0, -0.1])) == 0


def test_window_bins_split_by_softmask_against_a_direct_count():
    rng = np.random.default_rng(0)
    length, edges = 1000, bin_edges(1000, 7, "linear")
    wb = WindowBins(edges)
    data = []
    for _ in range(5):
        loss = rng.uniform(0, 2, length).astype(np.float32)
        counted, soft = rng.random(length) < 0.9, rng.random(length) < 0.5
        wb.add(loss, counted, soft)
        data.append((loss, counted, soft))
    loss_sums, counts = wb.loss, wb.count  # (5, 3, k)
    assert loss_sums.shape == (5, len(SUBSETS), 7) and len(wb) == 5
    assert (counts[:, 1] + counts[:, 2] == counts[:, 0]).all()
    np.testing.assert_allclose(loss_sums[:, 1] + loss_sums[:, 2], loss_sums[:, 0], rtol=1e-12)
    for i, (loss, counted, soft) in enumerate(data):
        for b in range(7):
            sl = slice(edges[b], edges[b + 1])
            rep = counted[sl] & soft[sl]
            assert counts[i, 1, b] == rep.sum()
            assert loss_sums[i, 1, b] == pytest.approx(loss[sl][rep].astype(np.float64).sum(), rel=1e-12)
    nomask = WindowBins(edges)
    nomask.add(*data[0][:2], None)
    assert (nomask.count[0, 1] == 0).all() and (nomask.count[0, 2] == nomask.count[0, 0]).all()
