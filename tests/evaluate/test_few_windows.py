"""An evaluation over one window: figures without intervals, an undefined trend, no effective context; window counts
above what a split holds."""

from __future__ import annotations

import csv
import re

from rich.console import Console

from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.plot import figure
from lcft.evaluate.stats import UNDEFINED
from lcft.evaluate.terminal import print_table
from lcft.genomics import prepare_windows
from tests.genomics.conftest import random_genome, write_fasta

from .conftest import WINDOW


def test_one_window_reports_no_interval_no_verdict_and_no_effective_context(data_dir, ckpt_a, ckpt_b, tmp_path):
    out = tmp_path / "r"
    rep = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a), str(ckpt_b)), out=str(out), bins=4,
                              max_windows=1, bootstrap=100, probe="copy", probe_segment=256, probe_windows=1))
    assert rep["data"]["windows"] == 1
    for ck in rep["checkpoints"]:
        for rec in (ck, ck["unique"], ck["nonrecurring"]):
            assert rec["relative_change"] is not None  # the point estimate is there
            assert rec["ci_low"] is None and rec["ci_high"] is None
            assert set(rec["bins"]["ci_low"] + rec["bins"]["ci_high"]) == {None}
        pr = ck["probe"]
        assert pr["drop"] and None not in pr["drop"] and set(pr["ci_low"] + pr["ci_high"]) == {None}
        assert ck["effective_context"] is None and pr["effective_context"] is None
    tr = rep["checkpoints"][1]["trend"]
    assert tr["verdict"] == UNDEFINED and tr["ci_low"] is None and tr["ci_high"] is None
    rows = list(csv.DictReader((out / "loss_by_position.csv").open()))
    assert rows and all(r["ci_low"] == r["ci_high"] == "" for r in rows)
    console = Console(width=200, record=True)
    print_table(rep, console)
    text = console.export_text()
    assert UNDEFINED in text and "[95% CI -, -]" in text and "none detected" not in text
    assert not re.search(r"\d\*", text)  # no drop starred as above zero by its interval
    # one window is counted in the singular: the tables' titles and the plot's
    assert "held-out loss on 1 eval window of" in text and "earlier, 1 window (" in text, text
    assert ": 1 window of 2K tokens" in figure(rep).axes[0].get_title()  # (then, maybe, where the guess is)


def test_window_counts_above_the_split_are_said_and_all_its_windows_read(ckpt_a, tmp_path, capfd):
    """--max-windows 5 and --probe-windows 7 over a split of 2 windows: both read 2, each said on stderr (they
    were capped silently)."""
    fasta = write_fasta(tmp_path / "g.fa", {"a": random_genome(1, WINDOW, n_runs=0),
                                            "b": random_genome(2, 2 * WINDOW + 10, n_runs=0)})
    data = tmp_path / "data"
    prepare_windows(fasta=str(fasta), out=str(data), length=WINDOW, train=("a",), eval=("b",))
    capfd.readouterr()
    rep = evaluate(EvalConfig(data=str(data), checkpoints=(str(ckpt_a),), out=str(tmp_path / "r"), bins=4,
                              max_windows=5, bootstrap=100, probe="copy", probe_segment=512, probe_windows=7))
    assert rep["data"]["windows"] == 2 and len(rep["checkpoints"][0]["windows"]) == 2 and rep["probe"]["windows"] == 2
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    assert said == ["warning: --max-windows 5 is more than split 'eval' holds (2 windows): all of them are evaluated",
                    "warning: --probe-windows 7 is more than the windows evaluated (2): the copy probe runs on all "
                    "of them"]
