"""The terminal tables' lines: fewer position bins than --bins asked for are said, not left to eval.json."""

from __future__ import annotations

from rich.console import Console

from lcft.evaluate.binning import bin_edges
from lcft.evaluate.terminal import print_table
from tests.evaluate.test_report import FakeWindows, _report


def _printed(report: dict) -> str:
    con = Console(record=True, width=200)
    print_table(report, con)
    return con.export_text()


def test_fewer_bins_than_asked_are_said_in_one_line(tmp_path):
    """32 log bins over 2048-token windows are 29 (the first ones narrower than one position merge): the table
    said nothing of it, and --bins 32 read as 32 bins."""
    got = len(bin_edges(FakeWindows.length, 32, "log")) - 1
    _, report, _ = _report(tmp_path, "log", bins=32)
    assert got < 32 and len(report["positions"]["edges"]) - 1 == got
    lines = [ln for ln in _printed(report).splitlines() if "position bins, not --bins" in ln]
    assert lines == [f"{got} position bins, not --bins 32: over 2,048 tokens the log bins narrower than one position "
                     "merge with the next (eval.json positions.edges)"]


def test_as_many_bins_as_asked_say_nothing(tmp_path):
    _, report, _ = _report(tmp_path, "log", bins=16)
    assert len(report["positions"]["edges"]) == 17 and "not --bins" not in _printed(report)
