"""In-window recurrence against a direct computation (a plain dict of earlier k-mers), its subsets in the
report, and the plot and tables drawing a split only where it has data."""

from __future__ import annotations

import numpy as np
import pytest

from lcft.evaluate.binning import SUBSETS, WindowBins, bin_edges
from lcft.evaluate.plot import figure
from lcft.evaluate.recurrence import (
    K,
    ascii_codes,
    distance_classes,
    histogram,
    nearest_copy,
    token_distances,
)
from lcft.evaluate.split import recurrence_distances
from lcft.evaluate.terminal import distance_line, recurrence_table, split_table
from lcft.genomics import open_windows


def direct_distances(seq: str, k: int = K) -> list[int]:
    """For each base: bases back to the latest earlier end of the same k-mer (case ignored), 0 if none or if
    the k-mer holds a letter other than A/C/G/T; one k-mer at a time with a dict of where each last ended."""
    seq = seq.upper()
    last: dict[str, int] = {}
    out = []
    for i in range(len(seq)):
        kmer = seq[i - k + 1:i + 1] if i >= k - 1 else ""
        if not kmer or set(kmer) - set("ACGT"):
            out.append(0)
            continue
        out.append(i - last[kmer] if kmer in last else 0)
        last[kmer] = i
    return out


def planted_window(data_dir, i: int = 1) -> tuple[str, int, int, int]:
    """A real held-out window's sequence with a 300-base segment copied 1,000 bases later, an N run inside
    the copy: (sequence, source start, copy start, segment length)."""
    seq = list(open_windows(data_dir, "eval").sequence(i))
    src, dst, seg = 200, 1200, 300
    seq[dst:dst + seg] = seq[src:src + seg]
    seq[dst + 150:dst + 153] = "NNN"
    return "".join(seq), src, dst, seg


def test_nearest_copy_equals_a_direct_computation_on_a_planted_copy(data_dir):
    seq, src, dst, seg = planted_window(data_dir)
    got = nearest_copy(ascii_codes(seq))
    assert got.tolist() == direct_distances(seq)
    # The copy recurs at exactly its distance where its 20-mer lies wholly inside the copy and clear of the Ns.
    inside = [p for p in range(dst + K - 1, dst + seg) if not dst + 150 <= p < dst + 153 + K - 1]
    assert all(got[p] == dst - src for p in inside)
    assert all(got[p] == 0 for p in range(dst + 150, dst + 153 + K - 1))  # a k-mer holding N never recurs
    assert nearest_copy(ascii_codes("ACGTACGTAC"), 4).tolist() == direct_distances("ACGTACGTAC", 4)
    assert nearest_copy(ascii_codes("acgtnnACGT"), 4).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 0, 6]


def test_window_recurrence_of_char_windows_equals_the_direct_computation(data_dir):
    ws = open_windows(data_dir, "eval")
    hits = 0
    for i in range(3):
        want = direct_distances(ws.sequence(i))
        assert recurrence_distances(ws, i).tolist() == want
        hits += sum(d > 0 for d in want)
    assert hits > 0  # real human DNA recurs within 2K bases (tandem and interspersed repeats)


def test_token_distances_use_the_k_mer_ending_at_each_tokens_last_base():
    base = np.array([0, 0, 3, 0, 5, 7, 0, 9])  # (8,) per base
    assert token_distances(base, np.array([3, 1, 2, 2])).tolist() == [3, 0, 7, 9]
    assert token_distances(base, None).tolist() == base.tolist()


def test_distance_histogram_counts_counted_recurring_tokens_by_class():
    edges = distance_classes(5000)
    assert edges.tolist() == [1, 16, 256, 4096, 5000]
    d = np.array([0, 1, 15, 16, 300, 4096, 4999, 9000, 2])
    counted = np.array([True] * 8 + [False])
    assert histogram(d, counted, edges).tolist() == [2, 1, 1, 3]  # the last class takes anything farther


def test_window_bins_split_by_recurrence_against_a_direct_count():
    rng = np.random.default_rng(4)
    length, edges = 600, bin_edges(600, 5, "linear")
    wb = WindowBins(edges)
    loss, counted = rng.uniform(0, 2, length), rng.random(length) < 0.9
    recur = np.where(rng.random(length) < 0.3, rng.integers(1, 500, length), 0)
    wb.add(loss, counted, None, None, recur)
    r, nr = SUBSETS.index("recurring"), SUBSETS.index("nonrecurring")
    for b in range(5):
        sl = slice(edges[b], edges[b + 1])
        again = counted[sl] & (recur[sl] > 0)
        assert wb.count[0, r, b] == again.sum() and wb.count[0, nr, b] == (counted[sl] & ~again).sum()
        assert wb.loss[0, r, b] == pytest.approx(loss[sl][again].sum(), rel=1e-12)
    none = WindowBins(edges)
    none.add(loss, counted, None)
    assert (none.count[0, r] == 0).all() and (none.count[0, nr] == none.count[0, 0]).all()


def _legends(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def _empty(report: dict, subset: str) -> dict:
    """The report with `subset` holding no tokens in any checkpoint (as when the windows lack it)."""
    for ck in report["checkpoints"]:
        ck[subset]["tokens"] = 0
    return report


def test_the_plot_draws_no_panel_for_an_empty_split(tmp_path):
    from .test_report import _report

    _, report, _ = _report(tmp_path)  # a soft mask on every window, no recurrence data
    fig = figure(report)
    assert len(fig.axes) == 3  # loss, change, repeats vs unique: no recurrence panel
    assert any("repeats" in t for t in _legends(fig)) and not any("recurring" in t for t in _legends(fig))
    report = _empty(report, "repeat")
    fig = figure(report)
    assert len(fig.axes) == 2 and not any("repeats" in t or "unique" in t for t in _legends(fig))
    assert split_table(report).startswith("no soft-masked")


def test_the_recurrence_table_is_one_line_when_nothing_recurs(tmp_path):
    from .test_report import _report

    _, report, _ = _report(tmp_path)
    report["recurrence"] = {"k": K, "distance_edges": [1, 16, 2048], "tokens": [0, 0]}
    assert recurrence_table(report) == (f"no {K}-mer occurs twice in any of these windows: no split into "
                                        "recurring and non-recurring tokens")
    assert distance_line(report) is None


def test_distance_classes_are_labelled_alike_the_last_one_open_ended(tmp_path):
    """Windows of a model tokenizer span a number of bases that is no round size (4,244): the last class read
    '4K-4244+'; it is '4K+', every other class 'a-b' in the same size notation."""
    from .test_report import _report

    _, report, _ = _report(tmp_path)
    tokens = report["checkpoints"][0]["tokens"]
    report["recurrence"] = {"k": K, "distance_edges": distance_classes(4244).tolist(), "tokens": [1, 2, 3, 4]}
    shares = [f"{n / tokens:.2%}" for n in (1, 2, 3, 4)]
    assert distance_line(report).endswith(f"(share of counted tokens): 1-16: {shares[0]}, 16-256: {shares[1]}, "
                                          f"256-4K: {shares[2]}, 4K+: {shares[3]}")
    report["recurrence"]["distance_edges"], report["recurrence"]["tokens"] = distance_classes(2048).tolist(), [1, 2, 3]
    assert distance_line(report).endswith(f"1-16: {shares[0]}, 16-256: {shares[1]}, 256+: {shares[2]}")


def test_eval_reports_the_recurrence_split_with_intervals(data_dir, ckpt_a, ckpt_b, tmp_path):
    import csv

    from lcft.evaluate import EvalConfig, evaluate

    n, bins = 3, 4
    rep = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a), str(ckpt_b)), out=str(tmp_path / "r"),
                              bins=bins, max_windows=n, bootstrap=200))
    ws = open_windows(data_dir, "eval")
    edges = np.asarray(rep["positions"]["edges"])
    classes = np.asarray(rep["recurrence"]["distance_edges"])
    want_bins, want_hist = np.zeros(bins, dtype=int), np.zeros(len(classes) - 1, dtype=int)
    with_recurring = 0  # windows holding a recurring token
    for i in range(n):
        seq = ws.sequence(i).upper()
        d = np.array(direct_distances(seq))  # (L,)
        counted = np.array([p > 0 and c in "ACGT" for p, c in enumerate(seq)])  # position 0 predicts nothing
        again = counted & (d > 0)
        with_recurring += bool(again.any())
        np.add.at(want_bins, np.searchsorted(edges, np.flatnonzero(again), side="right") - 1, 1)
        for x in d[again]:
            want_hist[min(np.searchsorted(classes, x, side="right") - 1, len(want_hist) - 1)] += 1
    assert rep["recurrence"]["k"] == K and rep["recurrence"]["tokens"] == want_hist.tolist()
    for ck in rep["checkpoints"]:
        assert ck["recurring"]["bins"]["tokens"] == want_bins.tolist()
        assert ck["recurring"]["tokens"] + ck["nonrecurring"]["tokens"] == ck["tokens"]
        assert sum(w["recurring_tokens"] for w in ck["windows"]) == want_bins.sum() > 0
    # The recurring tokens of these windows lie in one window: no interval from a bootstrap over windows;
    # the other subset keeps its interval.
    b = rep["checkpoints"][1]
    assert with_recurring == 1 and b["recurring"]["ci_low"] is None and b["recurring"]["ci_high"] is None
    assert b["recurring"]["relative_change"] is not None
    assert b["nonrecurring"]["ci_low"] < b["nonrecurring"]["relative_change"] < b["nonrecurring"]["ci_high"]
    rows = list(csv.DictReader((tmp_path / "r" / "loss_by_position.csv").open()))
    assert [int(r["tokens"]) for r in rows if r["subset"] == "recurring" and r["label"] == rep["checkpoints"][0]["label"]
            ] == want_bins.tolist()
    assert len(figure(rep).axes) == 3  # upper-case chr22: no soft-mask panel, a recurrence panel
    assert split_table(rep).startswith("no soft-masked") and not isinstance(recurrence_table(rep), str)
    assert "nearest earlier copy" in distance_line(rep)
