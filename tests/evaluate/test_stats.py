"""Paired bootstrap, trend and per-window bin sums on synthetic figures, against direct numpy computations."""

from __future__ import annotations

import numpy as np
import pytest

from lcft.evaluate.binning import SUBSETS, WindowBins, bin_edges
from lcft.evaluate.stats import (
    FLAT,
    GROWS,
    NO_TREND,
    SHRINKS,
    UNDEFINED,
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


def test_one_window_gives_no_interval_no_verdict_and_no_effective_context():
    ref, other, counts = _figures(n=1)
    w = resample_counts(1, 200, seed=0)
    c = mean_difference(other, counts, ref, counts, w, relative=True)
    np.testing.assert_allclose(c.value, other[0] / ref[0] - 1, rtol=1e-12)  # the point estimate stays
    assert np.isnan(c.low).all() and np.isnan(c.high).all()
    overall = mean_difference(other.sum(1), counts.sum(1), ref.sum(1), counts.sum(1), w, relative=True)
    assert np.isnan(overall.low) and np.isnan(overall.high) and not np.isnan(overall.value)
    t = trend(c, counts, w, np.arange(1, counts.shape[1] + 1) * 100.0)
    assert t.verdict == UNDEFINED and np.isnan(t.low) and np.isnan(t.high) and not np.isnan(t.slope)
    # a copy probe's drops from one window: no answer (cannot tell), not "none detected"
    assert effective_context(list(range(256, 256 * (counts.shape[1] + 1), 256)), (ref, counts), (other, counts)) is None


def test_a_cell_with_tokens_in_one_window_among_many_has_no_interval():
    ref, other, counts = _figures(n=14)
    for x in (ref, other, counts):
        x[np.arange(14) != 5, 2] = 0  # bin 2 holds tokens of window 5 only
        x[9, 4] = 0  # bin 4 without window 9: 13 windows left
    c = mean_difference(other, counts, ref, counts, resample_counts(14, 300, seed=1), relative=True)
    windows = (counts > 0).sum(0)  # (k,) windows with tokens in each bin (the same in both checkpoints)
    assert windows[2] == 1 and np.isnan(c.low[2]) and np.isnan(c.high[2])
    assert c.value[2] == pytest.approx(other[5, 2] / ref[5, 2] - 1, rel=1e-12)  # its point estimate stays
    defined = windows >= 2
    assert not np.isnan(c.low[defined]).any() and (c.low[defined] < c.high[defined]).all()
    # Tokens in both means is what counts: a bin where the reference has tokens in one window only.
    ref_sums, ref_counts = ref.copy(), counts.copy()
    ref_sums[1:, 0], ref_counts[1:, 0] = 0, 0
    c = mean_difference(other, counts, ref_sums, ref_counts, resample_counts(14, 300, seed=1), relative=True)
    assert np.isnan(c.low[0]) and not np.isnan(c.low[1])


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


def test_a_trend_over_fewer_than_two_bins_with_tokens_is_undefined_not_undetected():
    """One bin has no slope to fit: more windows would not make a trend detectable, so the verdict says why."""
    ref, other, counts = _figures(n=14, k=6)
    w = resample_counts(14, 200, seed=0)
    one = mean_difference(other[:, :1], counts[:, :1], ref[:, :1], counts[:, :1], w, relative=True)
    t = trend(one, counts[:, :1], w, np.array([100.0]))  # --bins 1
    assert t.verdict == FLAT and np.isnan(t.slope) and np.isnan(t.low) and np.isnan(t.high)
    for x in (ref, other, counts):
        x[:, 1:] = 0  # six bins, tokens in the first only
    c = mean_difference(other, counts, ref, counts, w, relative=True)
    assert not np.isnan(c.low[0])  # 14 windows: the bin's change has its interval
    assert trend(c, counts, w, np.arange(1, 7) * 100.0).verdict == FLAT


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


# End to end: intervals and the repeat/unique split of real evaluations on the bundled human sample.


@pytest.fixture(scope="module")
def masked_dir(tmp_path_factory):
    """2K-token windows held out from the sample's chr2 piece: soft-masked (its chr22 piece is upper case)."""
    from lcft.genomics import prepare_windows, sample_fasta

    out = tmp_path_factory.mktemp("data") / "masked-2k"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=2048, train=("chr22",), eval=("chr2",))
    return out


def _eval(data_dir, out, *ckpts, **kw):
    from lcft.evaluate import EvalConfig, evaluate

    return evaluate(EvalConfig(data=str(data_dir), checkpoints=tuple(str(c) for c in ckpts), out=str(out), **kw))


def test_identical_checkpoints_give_zero_width_intervals_at_zero(masked_dir, ckpt_a, tmp_path):
    import shutil

    from lcft.genomics import open_windows
    from lcft.genomics.tokenizer import decode

    n = 3
    copy = shutil.copytree(ckpt_a, tmp_path / "copy-of-a")
    rep = _eval(masked_dir, tmp_path / "r", ckpt_a, copy, bins=8, max_windows=n, bootstrap=200)
    b, edges = rep["checkpoints"][1], rep["positions"]["edges"]
    ws = open_windows(masked_dir, "eval")
    texts = [decode(np.asarray(ws[i]), ws.softmask(i)) for i in range(n)]  # lower case = soft-masked repeat
    seen = set()
    for rec, bases in ((b, "ACGTacgt"), (b["repeat"], "acgt"), (b["unique"], "ACGT")):
        assert rec["ci_low"] == 0.0 and rec["ci_high"] == 0.0
        # A bin's interval needs tokens of the subset in at least 2 windows (counted: position p >= 1).
        windows = [sum(any(c in bases for c in t[max(lo, 1):hi]) for t in texts)
                   for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
        for w, lo, hi in zip(windows, rec["bins"]["ci_low"], rec["bins"]["ci_high"], strict=True):
            assert (lo, hi) == ((0.0, 0.0) if w >= 2 else (None, None))
            seen.add(w >= 2)
    assert seen == {True, False}  # these windows have bins of both kinds
    assert b["trend"]["slope_per_doubling"] == 0.0 and b["trend"]["verdict"] == NO_TREND


def _window_bin_sums(model, ws, n, edges, max_context):
    """Per-window, per-bin loss sums and counts straight from token_losses (the per-window figures)."""
    import torch

    from lcft.evaluate import token_losses

    sums, counts = [], []
    for i in range(n):
        loss, counted = token_losses(model, torch.from_numpy(np.asarray(ws[i]).astype(np.int64))[None],
                                     max_context=max_context)
        loss, counted = loss[0].double().numpy(), counted[0].numpy()
        sums.append([loss[a:b][counted[a:b]].sum() for a, b in zip(edges[:-1], edges[1:], strict=True)])
        counts.append([counted[a:b].sum() for a, b in zip(edges[:-1], edges[1:], strict=True)])
    return np.array(sums), np.array(counts)


def test_self_against_a_short_context_matches_a_direct_bootstrap(data_dir, ckpt_a, tmp_path):
    from lcft.checkpoint.hf_folder import from_pretrained
    from lcft.genomics import open_windows

    n, reps = 4, 300
    rep = _eval(data_dir, tmp_path / "r", ckpt_a, ckpt_a, max_context=(0, 256), bins=4, max_windows=n,
                bootstrap=reps, seed=11)
    ws, model = open_windows(data_dir, "eval"), from_pretrained(ckpt_a).eval()
    edges = np.asarray(rep["positions"]["edges"])
    full, counts = _window_bin_sums(model, ws, n, edges, 0)
    cut, _ = _window_bin_sums(model, ws, n, edges, 256)
    lo, hi = _direct_bootstrap(full, cut, counts, reps, 11)  # per bin
    b = rep["checkpoints"][1]
    np.testing.assert_allclose(b["bins"]["ci_low"], lo, rtol=1e-5)
    np.testing.assert_allclose(b["bins"]["ci_high"], hi, rtol=1e-5)
    lo, hi = _direct_bootstrap(full.sum(1), cut.sum(1), counts.sum(1), reps, 11)  # overall
    assert b["ci_low"] == pytest.approx(lo, rel=1e-5) and b["ci_high"] == pytest.approx(hi, rel=1e-5)
    assert b["ci_low"] <= b["relative_change"] <= b["ci_high"]
    assert b["trend"]["verdict"] in (GROWS, SHRINKS, NO_TREND)


def test_same_seed_gives_the_same_interval(masked_dir, ckpt_a, ckpt_b, tmp_path):
    kw = dict(bins=4, max_windows=4, batch_size=4, bootstrap=100)

    def intervals(seed: int, out: str) -> list:
        ck = _eval(masked_dir, tmp_path / out, ckpt_a, ckpt_b, seed=seed, **kw)["checkpoints"][1]
        return [ck["ci_low"], ck["ci_high"], *ck["bins"]["ci_low"], *ck["bins"]["ci_high"], ck["repeat"]["ci_low"]]

    one = intervals(1, "1")
    assert one == intervals(1, "2") and one != intervals(2, "3")


def test_repeat_and_unique_split_adds_up_and_counts_lower_case_bases(masked_dir, ckpt_b, tmp_path):
    import csv

    from lcft.genomics import open_windows
    from lcft.genomics.tokenizer import decode

    n = 4
    rep = _eval(masked_dir, tmp_path / "r", ckpt_b, bins=8, max_windows=n, bootstrap=50)
    ck = rep["checkpoints"][0]
    r, u = ck["repeat"], ck["unique"]
    assert r["tokens"] + u["tokens"] == ck["tokens"] and r["tokens"] > 0 and u["tokens"] > 0
    assert (r["loss"] * r["tokens"] + u["loss"] * u["tokens"]) / ck["tokens"] == pytest.approx(ck["loss"], rel=1e-9)
    assert [a + b for a, b in zip(r["bins"]["tokens"], u["bins"]["tokens"], strict=True)] == ck["bins"]["tokens"]
    ws = open_windows(masked_dir, "eval")
    edges = rep["positions"]["edges"]
    lower = np.zeros(len(edges) - 1, dtype=np.int64)
    for i in range(n):
        text = decode(np.asarray(ws[i]), ws.softmask(i))  # lower case = soft-masked repeat
        for b in range(len(edges) - 1):  # counted: a base A/C/G/T predicted at position p >= 1
            lower[b] += sum(c in "acgt" for c in text[max(edges[b], 1):edges[b + 1]])
    assert r["bins"]["tokens"] == lower.tolist()
    rows = list(csv.DictReader((tmp_path / "r" / "loss_by_position.csv").open()))
    assert [int(x["tokens"]) for x in rows if x["subset"] == "repeat"] == lower.tolist()
    assert sum(w["repeat_tokens"] for w in ck["windows"]) == r["tokens"]


def test_bootstrap_must_be_positive():
    from lcft.config import ConfigError
    from lcft.evaluate import EvalConfig

    for bad in (0, -5):
        with pytest.raises(ConfigError, match="--bootstrap") as e:
            EvalConfig(data="d", checkpoints=("c",), bootstrap=bad).validate()
        assert "\n" not in str(e.value)
