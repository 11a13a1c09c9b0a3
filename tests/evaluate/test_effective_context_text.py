"""An effective context the copy probe cannot tell apart from one it never measured: the terminal table and
eval.json each say which (the demo summary's lines are in tests/recipes/test_demo.py)."""

from __future__ import annotations

import io

import numpy as np

from lcft.console import make_console
from lcft.evaluate.binning import bin_edges
from lcft.evaluate.checkpoints import CheckpointInfo
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.probe import CopyProbe
from lcft.evaluate.report import build_report
from lcft.evaluate.terminal import print_table
from tests.evaluate.test_report import FakeWindows, _result
from tests.evaluate.test_terminal_width import _full_report


def _shown(report: dict) -> str:
    out = io.StringIO()
    print_table(report, make_console(width=250, file=out))
    return " ".join(out.getvalue().split())


def test_the_terminal_table_says_cannot_tell_with_the_probe_windows_and_nothing_without_a_probe(tmp_path):
    report = _full_report(tmp_path, "long")  # a probe over 3 windows
    report["checkpoints"][1]["probe"]["effective_context"] = None
    report["checkpoints"][1]["probe"]["mutated"]["effective_context"] = None
    text = _shown(report)
    assert text.count("cannot tell (too few with tokens of 3 probe windows)") == 2, text  # the exact and the mutated copy
    assert "│ 4K │ 1K │" in text  # the first checkpoint's, measured
    for ck in report["checkpoints"]:
        ck["probe"] = ck["effective_context"] = None
    report["probe"] = None
    text = _shown(report)
    assert "copy probe" not in text and "effective context" not in text and "cannot tell" not in text


def _probe(n: int) -> CopyProbe:
    """A probe of `n` windows whose exact copy lowers every target loss by 0.5 nats/token."""
    windows = [np.full(FakeWindows.length, 4 + w % 4, dtype=np.uint8) for w in range(n)]
    probe = CopyProbe(windows, n, segment=64, distances=(64, 256, 1024), mutation=0.0, seed=0)
    counted = np.ones(FakeWindows.length, dtype=bool)
    for k in range(len(probe)):
        probe.record(k, np.full(FakeWindows.length, 1.0 - 0.5 * (k % 2), dtype=np.float32), counted)
    return probe


def _json(tmp_path, probe_windows: int | None) -> dict:
    cfg = EvalConfig(data=str(tmp_path / "data"), checkpoints=("a",), labels=("base",), out=str(tmp_path / "out"),
                     probe="copy" if probe_windows else "none")
    result = _result(0, 1.0)
    result.probe = _probe(probe_windows) if probe_windows else None
    info = CheckpointInfo("base", "base", tmp_path / "base", 0, {"vocab_size": 16})
    return build_report(cfg, FakeWindows(), 3, [info], [result], bin_edges(FakeWindows.length, cfg.bins,
                                                                             cfg.bin_scale))


def test_eval_json_keeps_effective_context_null_and_says_why(tmp_path):
    # 3 windows over 3 distances: even a drop in every window, p = 2^-3, cannot pass 2.5% / 3: cannot tell
    few = _json(tmp_path, 3)
    (ck,) = few["checkpoints"]
    assert ck["effective_context"] is None and ck["probe"]["effective_context"] is None
    assert ck["probe"]["drop"] == [0.5, 0.5, 0.5]  # the probe ran and every window dropped
    assert "null = cannot tell (too few windows with tokens" in few["probe"]["note"]
    enough = _json(tmp_path, 8)  # 2^-8 < 2.5% / 3
    assert enough["checkpoints"][0]["effective_context"] == 1024
    none = _json(tmp_path, None)  # no probe: its options and the checkpoint's figures are null
    assert none["probe"] is None and none["checkpoints"][0]["probe"] is None
    assert none["checkpoints"][0]["effective_context"] is None
