"""Position bins and reductions on synthetic per-token losses, against brute-force numpy oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lcft.evaluate.binning import PositionSums, bin_edges, relative_change, tenths


@pytest.mark.parametrize("length,bins", [(1024, 32), (65536, 32), (1000, 7), (64, 32)])
def test_linear_edges_cover_the_window_in_equal_bins(length, bins):
    e = bin_edges(length, bins, "linear")
    assert e[0] == 0 and e[-1] == length and len(e) == bins + 1
    widths = np.diff(e)
    assert widths.min() >= 1 and widths.max() - widths.min() <= 1


def test_log_edges_grow_geometrically_and_start_at_zero():
    e = bin_edges(65536, 16, "log")
    assert e[0] == 0 and e[-1] == 65536 and np.all(np.diff(e) > 0)
    ratios = e[2:] / e[1:-1]
    assert np.allclose(ratios[4:], 2.0, rtol=0.05)  # 65536 = 2**16 over 16 bins: each bin doubles


@pytest.mark.parametrize("scale", ["linear", "log"])
@pytest.mark.parametrize("length,bins", [(65536, 32), (131072, 32), (262144, 32), (1 << 20, 64), (64, 64),
                                         (100, 80), (1000, 700), (2048, 12), (3, 8)])
def test_every_bin_holds_a_predicted_position_and_the_bins_partition_the_window(length, bins, scale):
    e = bin_edges(length, bins, scale)
    pos = np.arange(length)
    which = np.searchsorted(e, pos, side="right") - 1  # (L,) the bin of each position: e[b] <= p < e[b + 1]
    assert e[0] == 0 and e[-1] == length and np.all(np.diff(e) > 0)  # every position in exactly one bin
    assert which.min() == 0 and which.max() == len(e) - 2
    predicted = np.bincount(which[pos >= 1], minlength=len(e) - 1)  # position 0 predicts nothing
    assert predicted.min() >= 1 and which[0] == which[1]


def test_short_window_with_many_log_bins_merges_empty_bins():
    e = bin_edges(100, 64, "log")
    assert e[0] == 0 and e[-1] == 100 and np.all(np.diff(e) >= 1) and len(e) - 1 < 64


def test_bad_scale_is_refused():
    with pytest.raises(ValueError):
        bin_edges(100, 4, "quadratic")


def _synthetic(length: int, windows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    loss = rng.gamma(2.0, 0.7, size=(windows, length))  # (W, L)
    mask = rng.random((windows, length)) > 0.15  # (W, L) some positions not counted (N targets)
    mask[:, 0] = False  # position 0 predicts nothing
    mask[1, 100:300] = False  # an N run
    return loss, mask


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_bin_means_match_brute_force_and_weight_to_the_overall_mean(scale):
    length, windows = 1000, 5
    loss, mask = _synthetic(length, windows)
    sums = PositionSums.zeros(length)
    for w in range(windows):
        sums.add(loss[w], mask[w])
    edges = bin_edges(length, 13, scale)
    means, counts = sums.binned(edges)
    pos = np.broadcast_to(np.arange(length), loss.shape)
    for b in range(len(edges) - 1):
        sel = mask & (pos >= edges[b]) & (pos < edges[b + 1])
        assert counts[b] == sel.sum()
        assert means[b] == pytest.approx(loss[sel].mean(), rel=1e-12)
    overall = loss[mask].mean()
    assert sums.mean() == pytest.approx(overall, rel=1e-12)
    assert np.sum(means * counts) / counts.sum() == pytest.approx(overall, rel=1e-12)


def test_bin_without_tokens_is_nan_not_zero():
    sums = PositionSums.zeros(10)
    mask = np.zeros(10, dtype=bool)
    mask[5:] = True
    sums.add(np.ones(10), mask)
    means, counts = sums.binned(bin_edges(10, 2))
    assert math.isnan(means[0]) and counts[0] == 0 and means[1] == 1.0 and counts[1] == 5
    assert math.isnan(PositionSums.zeros(4).mean())


def test_tenths_and_range_means():
    (a, b), (c, d) = tenths(1000)
    assert (a, b, c, d) == (0, 100, 900, 1000)
    loss, mask = _synthetic(1000, 3, seed=1)
    sums = PositionSums.zeros(1000)
    for w in range(3):
        sums.add(loss[w], mask[w])
    assert sums.range_mean(900, 1000) == pytest.approx(loss[:, 900:][mask[:, 900:]].mean(), rel=1e-12)


@pytest.mark.parametrize("length", [8, 16, 24])
def test_the_first_tenth_of_a_tiny_window_holds_a_predicted_position(length):
    """Position 0 predicts nothing: a first tenth of [0, 1) would leave the figure undefined in every window."""
    (a, b), (c, d) = tenths(length)
    assert (a, c, d) == (0, length - max(1, length // 10), length) and b == max(2, length // 10)
    loss, mask = _synthetic(length, 3, seed=2)
    mask[:, 1] = True  # a base predicted at position 1 (position 0 is never counted)
    sums = PositionSums.zeros(length)
    for w in range(3):
        sums.add(loss[w], mask[w])
    assert sums.range_mean(a, b) == pytest.approx(loss[:, 1:b][mask[:, 1:b]].mean(), rel=1e-12)  # defined


def test_relative_change():
    assert relative_change(1.1, 1.0) == pytest.approx(0.1)
    x = np.array([1.0, 2.0, np.nan])
    out = relative_change(x, x)
    assert out[0] == 0 and out[1] == 0 and math.isnan(out[2])
