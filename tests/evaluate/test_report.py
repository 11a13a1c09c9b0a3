"""Report writing on synthetic per-token losses: JSON, CSV and PNG agree with the sums they came from."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from lcft.config_toml import to_dict
from lcft.evaluate.binning import LN2, UNIFORM_LOSS, PositionSums, WindowBins, bin_edges
from lcft.evaluate.checkpoints import CheckpointInfo, prepare_checkpoints
from lcft.evaluate.config import NOT_FIGURES, EvalConfig
from lcft.evaluate.inputs import open_split
from lcft.evaluate.report import CSV_COLUMNS, build_report, read_back_problem, write_outputs
from lcft.evaluate.runner import _identity
from lcft.evaluate.split import CheckpointResult
from lcft.evaluate.terminal import table, trend_lines
from lcft.files import read_json
from lcft.parallel.config import LaunchConfig
from tests.evaluate.conftest import ckpt_a, data_dir  # noqa: F401 (fixtures)


class FakeWindows:
    """What build_report reads from a WindowSet."""

    length = 2048
    manifest = {"tokenizer": {"name": "dna-char", "vocab_size": 16}}

    def __len__(self) -> int:
        return 3


def _result(seed: int, scale: float, scale_of_bins: str = "linear", n_bins: int = 16) -> CheckpointResult:
    rng = np.random.default_rng(seed)
    sums = PositionSums.zeros(FakeWindows.length)
    bins = WindowBins(bin_edges(FakeWindows.length, n_bins, scale_of_bins))
    windows = []
    for w in range(3):
        loss = scale * rng.gamma(4.0, 0.35, FakeWindows.length)  # (L,)
        mask = rng.random(FakeWindows.length) > 0.1  # (L,)
        mask[0] = False
        sums.add(loss, mask)
        bins.add(loss, mask, np.random.default_rng(w).random(FakeWindows.length) < 0.5)  # same soft mask for all
        windows.append({"index": w, "chrom": "chr22", "start": w * 2048, "end": (w + 1) * 2048,
                        "tokens": int(mask.sum()), "loss": float(loss[mask].mean())})
    return CheckpointResult(sums, windows, bins)


def _report(tmp_path: Path, scale: str = "linear", second: float = 0.9, bins: int = 16):
    cfg = EvalConfig(data=str(tmp_path / "data"), checkpoints=("a", "b"), labels=("base", "long"),
                     bins=bins, bin_scale=scale, out=str(tmp_path / "out"))
    infos = [CheckpointInfo(lb, f"runs/{lb}", tmp_path / lb, 0, {"vocab_size": 16}) for lb in ("base", "long")]
    results = [_result(0, 1.0, scale, bins), _result(1, second, scale, bins)]
    edges = bin_edges(FakeWindows.length, cfg.bins, cfg.bin_scale)
    return cfg, build_report(cfg, FakeWindows(), 3, infos, results, edges), results


def test_eval_toml_names_absolute_paths_and_keeps_a_hub_id(tmp_path, monkeypatch):
    """eval.toml, written from a working folder, names every path absolute (found there or not) and a Hub id as
    written: `--config eval.toml` reruns it from anywhere."""
    from lcft.config_toml import load_toml

    cfg, report, _ = _report(tmp_path)
    monkeypatch.chdir(tmp_path)
    write_outputs(report, Path("out"), EvalConfig(data="data", checkpoints=("a", "org/model"), out="out"))
    saved = load_toml(tmp_path / "out" / "eval.toml")
    assert (saved["data"], saved["checkpoints"], saved["out"]) == (
        str(tmp_path / "data"), [str(tmp_path / "a"), "org/model"], str(tmp_path / "out"))


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_json_csv_png_agree_with_the_sums(tmp_path, scale):
    cfg, report, results = _report(tmp_path, scale)
    paths = write_outputs(report, Path(cfg.out), cfg)
    on_disk = json.loads(paths["json"].read_text())
    assert on_disk["checkpoints"][1]["label"] == "long"
    for ck, res in zip(on_disk["checkpoints"], results, strict=True):
        assert ck["loss"] == pytest.approx(res.sums.mean(), rel=1e-12)
        assert ck["bits_per_base"] == pytest.approx(res.sums.mean() / LN2, rel=1e-12)
        b = ck["bins"]
        weighted = sum(v * n for v, n in zip(b["loss"], b["tokens"], strict=True)) / sum(b["tokens"])
        assert weighted == pytest.approx(ck["loss"], rel=1e-12)
        assert len(ck["windows"]) == 3
    rows = list(csv.DictReader(paths["csv"].open()))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 2 * 5 * (len(on_disk["positions"]["edges"]) - 1)
    for row in (r for r in rows if r["subset"] == "all"):
        ck = next(c for c in on_disk["checkpoints"] if c["label"] == row["label"])
        i = int(row["bin"])
        assert float(row["loss_nats_per_token"]) == ck["bins"]["loss"][i]  # repr round-trips exactly
        assert int(row["tokens"]) == ck["bins"]["tokens"][i]
        assert float(row["relative_change"]) == ck["bins"]["relative_change"][i]
        assert [float(row[k]) if row[k] else None for k in ("ci_low", "ci_high")] == [
            ck["bins"]["ci_low"][i], ck["bins"]["ci_high"][i]]
        assert int(row["start"]) == on_disk["positions"]["edges"][i]
    # a CSV opened alone says the change's unit and what each label stands for; eval.json names every unit
    change = "fraction: (loss - base's loss) / base's loss; 0.01 = 1%"
    assert {(r["label"], r["checkpoint"], r["change_unit"]) for r in rows} == {
        ("base", "runs/base", change), ("long", "runs/long", change)}
    u = on_disk["units"]
    assert (u["relative_change"], u["loss"], u["edges"]) == (change, "nats per token", "tokens")
    assert u["slope_per_doubling"] == "fraction per doubling of position: (loss - base's loss) / base's loss; 0.01 = 1%"
    # the fractions stored are the terminal's percent figures divided by 100
    long, tr = on_disk["checkpoints"][1], on_disk["checkpoints"][1]["trend"]
    con = Console(record=True, width=200)
    con.print(table(on_disk))
    assert (f"{100 * long['relative_change']:+.2f}% [{100 * long['ci_low']:+.2f}, {100 * long['ci_high']:+.2f}]"
            in con.export_text())
    assert f"change {100 * tr['slope_per_doubling']:+.3f}% per doubling" in trend_lines(on_disk)[0]
    ref = on_disk["checkpoints"][0]["label"]
    # the reference against itself has no interval: empty cells, not 0.0; the other's are figures
    assert all(r["ci_low"] == r["ci_high"] == "" for r in rows if r["label"] == ref)
    assert any(r["ci_low"] != "" and r["ci_high"] != "" for r in rows if r["label"] != ref)
    assert on_disk["uniform"] == {"loss": UNIFORM_LOSS, "bits_per_base": pytest.approx(2.0)}
    assert (Path(cfg.out) / "eval.toml").is_file()
    assert not list(Path(cfg.out).glob(".*.tmp"))
    import matplotlib.image as mpimg

    img = mpimg.imread(paths["png"])
    assert img.shape[0] > 300 and img.shape[1] > 300
    assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 10  # lines and text, not one colour


@pytest.mark.parametrize("position", ["tokens", "bases"])
def test_each_csv_row_names_the_unit_its_bin_edges_count(tmp_path, position):
    """A bin's start and end count tokens or bases (--position): the CSV says which on every row, as eval.json's
    positions.unit does, so two CSVs whose edges read alike are not taken for one axis."""
    cfg = EvalConfig(data=str(tmp_path / "data"), checkpoints=("a", "b"), labels=("base", "long"), bins=4,
                     position=position, out=str(tmp_path / "out"))
    infos = [CheckpointInfo(lb, lb, tmp_path / lb, 0, {"vocab_size": 16}) for lb in ("base", "long")]
    results = [_result(0, 1.0, n_bins=4), _result(1, 0.9, n_bins=4)]
    report = build_report(cfg, FakeWindows(), 3, infos, results, bin_edges(FakeWindows.length, 4))
    rows = list(csv.DictReader(write_outputs(report, Path(cfg.out), cfg)["csv"].open()))
    assert report["positions"]["unit"] == position
    assert len(rows) == 2 * 5 * 4 and {r["position_unit"] for r in rows} == {position}


def test_relative_change_against_the_first(tmp_path):
    _, report, _ = _report(tmp_path, second=0.9)
    first, second = report["checkpoints"]
    assert first["relative_change"] == 0.0 and all(v == 0.0 for v in first["bins"]["relative_change"])
    assert second["relative_change"] == pytest.approx(second["loss"] / first["loss"] - 1, rel=1e-12)
    for v, a, b in zip(second["bins"]["relative_change"], second["bins"]["loss"], first["bins"]["loss"], strict=True):
        assert v == pytest.approx(a / b - 1, rel=1e-12)


def test_table_has_a_row_per_checkpoint_and_the_uniform_guess(tmp_path):
    from rich.console import Console

    _, report, _ = _report(tmp_path)
    con = Console(record=True, width=160)
    con.print(table(report))
    text = con.export_text()
    assert "base" in text and "long" in text and "uniform guess" in text and "2.000" in text
    assert f"{UNIFORM_LOSS:.4f}" in text and not math.isnan(report["checkpoints"][1]["loss"])
    base_row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("base"))
    cells = [c.strip() for c in base_row.strip(" │").split("│")]
    heads = [c.header for c in table(report).columns]
    assert cells[heads.index("vs base [95% CI]\n%")] == "reference" and "%" not in base_row  # not against itself


def test_the_table_calls_intervals_from_few_windows_rough(tmp_path):
    """Percentile intervals from 3 windows hold the truth far less often than 95% (test_stats_coverage.py)."""
    from rich.console import Console

    from lcft.evaluate.stats import FEW_WINDOWS

    _, report, _ = _report(tmp_path)
    for windows, rough in ((3, True), (FEW_WINDOWS, False)):
        report["data"]["windows"] = windows
        con = Console(record=True, width=300)
        con.print(table(report))
        assert ("with this few windows the intervals are rough" in con.export_text()) == rough


def test_one_position_bin_gives_an_undefined_trend_said_in_the_terminal(tmp_path):
    from lcft.evaluate.stats import FLAT
    from lcft.evaluate.terminal import trend_lines

    _, report, _ = _report(tmp_path, bins=1)
    tr = report["checkpoints"][1]["trend"]
    assert tr == {"slope_per_doubling": None, "ci_low": None, "ci_high": None, "verdict": FLAT}
    assert report["checkpoints"][1]["ci_low"] is not None  # three windows: the change itself has its interval
    assert trend_lines(report) == [f"long vs base: trend {FLAT}"]


def test_a_report_that_fails_to_write_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """A full disk while the second report's eval.json is written (after its CSV, plot and TOML): every file of
    the first report is as it was, byte for byte, and no temp file is left. Each file was replaced in turn
    before, so the folder held the new CSV beside the old eval.json."""
    import errno
    import os

    from lcft.errors import LcftError
    from lcft.evaluate import report as report_module

    cfg, first, _ = _report(tmp_path)
    out = Path(cfg.out)
    write_outputs(first, out, cfg)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _, second, _ = _report(tmp_path, "log", second=0.5)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(report_module.json, "dump", no_space)
    with pytest.raises(LcftError, match="cannot write the report into .*No space left"):
        write_outputs(second, out, cfg)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.undo()
    paths = write_outputs(second, out, cfg)
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    assert json.loads(paths["json"].read_text())["positions"]["bin_scale"] == "log"


def test_the_plot_draws_names_that_are_not_printable_escaped(tmp_path):
    """A label or data folder name holding a byte that is not UTF-8 (a surrogate in Python, as a default label
    from a folder's name carries it) or a terminal escape: drawn escaped; the font could not draw it at all."""
    from lcft.evaluate.plot import figure

    _, report, _ = _report(tmp_path)
    report["checkpoints"][1]["label"] = "long\udcc3"
    report["data"]["folder"] = str(tmp_path / "d\udcb6\x1b[31m")
    fig = figure(report)
    fig.savefig(tmp_path / "p.png")
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert any("long\\udcc3" in t for t in texts) and any("d\\udcb6\\x1b[31m" in t for t in texts)


def _top_middle_bottom(report: dict) -> tuple:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from lcft.evaluate.plot import figure

    fig = figure(report)
    FigureCanvasAgg(fig).draw()  # lays out the legends placed beside the panels
    axes = fig.axes
    return fig, axes[0], axes[1], axes[-1]


@pytest.mark.parametrize("shift", [0.0, 2.5])
def test_the_plot_keeps_its_curves_readable(tmp_path, shift):
    """No 'base vs base' line at 0 (the zero line is there already); no legend over any panel's lines; the
    uniform guess (2 bits/base) drawn only near the curves (here within 0.1 bits of them, or 2.5 bits above and
    off the scale), else named in the title, the axis then spanning the curves only."""
    _, report, _ = _report(tmp_path)
    for ck in report["checkpoints"]:
        ck["bins"]["bits_per_base"] = [None if v is None else v + shift for v in ck["bins"]["bits_per_base"]]
    fig, top, middle, bottom = _top_middle_bottom(report)
    ref = report["checkpoints"][0]["label"]
    assert [ln.get_label() for ln in middle.get_lines() if not ln.get_label().startswith("_")] == [f"long vs {ref}"]
    renderer = fig.canvas.get_renderer()
    for ax in (top, middle, bottom):
        legend = ax.get_legend()
        assert legend is not None
        box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert box.x0 >= area.x1, (box, area)  # beside the panel, clear of every line
    bits = [v for ck in report["checkpoints"] for v in ck["bins"]["bits_per_base"] if v is not None]
    guess = [ln for ln in top.get_lines() if ln.get_label().startswith("uniform guess")]
    low, high = top.get_ylim()
    if shift:
        assert not guess and low > 2.0 and "uniform guess 2 bits/base" in top.get_title()
        assert high - low < 2 * (max(bits) - min(bits)) + 0.5  # the curves fill the axis
    else:
        assert guess and low <= 2.0 <= high


def _tampered(report: dict, how: str) -> dict:
    r = json.loads(json.dumps(report))
    long = r["checkpoints"][1]
    if how == "replicates":
        r["bootstrap"]["replicates"] = 10**10  # replicates x windows int64 is what the intervals allocate
    elif how == "no bootstrap":
        del r["bootstrap"]
    elif how == "seed":
        r["bootstrap"]["seed"] = 7
    elif how == "windows":
        long["windows"] = long["windows"] * 1000
    elif how == "data windows":
        r["data"]["windows"] = 3000
    elif how == "checkpoints":
        r["checkpoints"] = r["checkpoints"] * 2
    elif how == "options":
        r["options"]["bins"] = 3
    elif how in ("NaN", "Infinity", "1e999"):
        long["loss"] = "@"  # written as a bare JSON token below
    elif how == "integer past 64 bits":
        long["windows"][0]["tokens"] = 1 << 64
    return r


@pytest.mark.parametrize("how, said", [
    ("replicates", "bootstrap is not 1,000 replicates"), ("no bootstrap", "bootstrap is not"), ("seed", "seed 0"),
    ("windows", "2 checkpoints of 3 windows"), ("data windows", "does not count 3 windows"),
    ("checkpoints", "2 checkpoints"), ("options", "other options"), ("NaN", "not finite"),
    ("Infinity", "not finite"), ("1e999", "not finite"), ("integer past 64 bits", "not finite")])
def test_a_report_read_back_is_checked_against_the_options_that_write_it(tmp_path, how, said):
    cfg, report, _ = _report(tmp_path)
    write_outputs(report, Path(cfg.out), cfg)
    path = Path(cfg.out) / "eval.json"
    assert read_back_problem(read_json(path), cfg, 3) is None
    assert "does not count 4 windows" in read_back_problem(read_json(path), cfg, 4)
    path.write_text(json.dumps(_tampered(report, how)).replace('"@"', how))
    problem = read_back_problem(read_json(path), cfg, 3)
    assert problem is not None and said in problem, problem


def test_bins_past_most_windows_spans_are_counted_flagged_and_shaded(tmp_path):
    """Windows of uneven spans (as a model tokenizer's windows in bases, the bins over the longest): each bin's
    count of windows with tokens equals a numpy count over the windows' masks; the bins with fewer than half of
    them are named in the terminal and shaded in the plot."""
    from lcft.evaluate.plot import figure
    from lcft.evaluate.terminal import thin_line

    spans, length = (700, 1100, 1500, 2048, 900), FakeWindows.length
    edges = bin_edges(length, 16)
    masks = []
    for span in spans:
        mask = np.zeros(length, dtype=bool)
        mask[1:span] = True
        masks.append(mask)
    masks[0][200:400] = False  # a run of N: no counted token there
    results = []
    for scale in (1.0, 0.9):
        sums, bins = PositionSums.zeros(length), WindowBins(edges)
        rng = np.random.default_rng(0)
        for mask in masks:
            loss = scale * rng.gamma(4.0, 0.35, length)  # (L,)
            sums.add(loss, mask)
            bins.add(loss, mask, None)
        windows = [{"index": w, "chrom": "chr22", "start": 0, "end": s, "tokens": int(m.sum()), "loss": 1.0}
                   for w, (s, m) in enumerate(zip(spans, masks, strict=True))]
        results.append(CheckpointResult(sums, windows, bins))
    cfg = EvalConfig(data=str(tmp_path / "data"), checkpoints=("a", "b"), labels=("base", "long"), bins=16,
                     out=str(tmp_path / "out"))
    infos = [CheckpointInfo(lb, lb, tmp_path / lb, 0, {"vocab_size": 16}) for lb in ("base", "long")]
    report = build_report(cfg, FakeWindows(), len(spans), infos, results, edges)
    want = np.array([[m[a:b].any() for a, b in zip(edges[:-1], edges[1:], strict=True)] for m in masks]).sum(0)
    assert report["positions"]["windows"] == want.tolist()
    thin = np.flatnonzero(want * 2 < len(spans))  # fewer than half of the 5: 2 windows or fewer
    assert len(thin) and thin.tolist() == list(range(thin[0], 16))  # past the third-longest span
    line = thin_line(report)
    assert line.startswith(f"{len(thin)} of 16 position bins (the first from {edges[thin[0]]:,} tokens)"), line
    assert len(figure(report).axes[0].patches) == len(thin)
    report["positions"]["windows"] = [len(spans)] * 16
    assert thin_line(report) is None and not figure(report).axes[0].patches


def test_a_report_read_back_ignores_only_the_options_no_figure_depends_on(tmp_path):
    """Every launch option, the output folder and the device by name may differ from the run that wrote the
    report (each is changed to a value no option takes); any other option differing makes it another's."""
    cfg, report, _ = _report(tmp_path)
    assert {f.name for f in dataclasses.fields(LaunchConfig)} | {"out", "device"} == NOT_FIGURES
    assert NOT_FIGURES < set(report["options"])  # each names an option (one renamed would be compared again)
    for name in report["options"]:
        other = copy.deepcopy(report)
        other["options"][name] = ["not", "an", "option"]
        problem = read_back_problem(other, cfg, 3)
        assert problem is None if name in NOT_FIGURES else "other options" in problem, name


def test_the_pass_key_reads_none_of_the_options_no_figure_depends_on(data_dir, ckpt_a, tmp_path):  # noqa: F811
    """`_identity` keys kept losses on the options it reads: none of NOT_FIGURES (so the kept losses of a run
    under one launch are read back under another, as its report is)."""
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a),), out=str(tmp_path / "out"))
    ws = open_split(cfg)
    info = prepare_checkpoints(cfg, ws.length, ws.manifest.get("tokenizer", {}))[0]
    read: set[str] = set()

    class Spy:
        def __getattr__(self, name: str):
            read.add(name)
            return getattr(cfg, name)

    _identity(Spy(), ws, info, torch.device("cpu"))
    assert read and read <= set(to_dict(cfg)) and not read & NOT_FIGURES, read
