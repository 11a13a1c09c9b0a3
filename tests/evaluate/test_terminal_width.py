"""The evaluation tables at a terminal's width: every figure and label whole, never cut with '…', every line
within the width (a narrow terminal gets the columns in groups, or one block per checkpoint)."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len

from lcft.console import make_console
from lcft.evaluate.terminal import print_table
from tests.evaluate.test_report import _report

LONG_LABEL = "long-context-step-12000"


def _full_report(tmp_path, label: str) -> dict:
    """A two-checkpoint report with every table: repeats, recurrence (the repeat split reused), a copy probe."""
    _, report, _ = _report(tmp_path)
    report["checkpoints"][1]["label"] = label
    for i, ck in enumerate(report["checkpoints"]):
        ck["recurring"], ck["nonrecurring"] = ck["repeat"], ck["unique"]
        ck["probe"] = {"drop": [0.5 + i, 0.25, -0.125], "ci_low": [0.1, None, -0.3], "effective_context": 4096,
                       "mutated": {"effective_context": 1024}}
    report["recurrence"] = {"k": 20, "distance_edges": [1, 16, 256, 2048], "tokens": [1, 2, 3]}
    report["probe"] = {"segment": 64, "distances": [1024, 16384, 131072], "mutation": 0.1, "windows": 3}
    return report


def _whole(report: dict) -> list[str]:
    """Every label and figure the tables show, formatted here from the report's numbers."""
    cells = ["uniform guess", "reference", "nats/token", "bits/base", "non-recurring",
             "effective context", "with 10% changed", "D=128K", "+1.5000*", "+0.2500", "-0.1250", "4K", "1K"]
    for i, ck in enumerate(report["checkpoints"]):
        first, last = ck["first_tenth_loss"], ck["last_tenth_loss"]
        cells += [ck["label"], f"{ck['loss']:.4f}", f"{ck['bits_per_base']:.3f}", f"{first:.4f}", f"{last:.4f}",
                  f"{last - first:+.4f}", f"{ck['repeat']['tokens'] / ck['tokens'] * 100:.1f}%",
                  f"{ck['repeat']['loss']:.4f}", f"{ck['unique']['loss']:.4f}"]
        for rec in (ck, ck["repeat"], ck["unique"]) if i else ():
            cells.append(f"{100 * rec['relative_change']:+.2f}% [{100 * rec['ci_low']:+.2f}, "
                         f"{100 * rec['ci_high']:+.2f}]")
    return cells


@pytest.mark.parametrize("width", [80, 120, 60, 40])
@pytest.mark.parametrize("label", ["long", LONG_LABEL])
def test_no_figure_or_label_is_cut_at_the_terminal_width(tmp_path, width, label):
    """80: a terminal, or a pipe or a file without COLUMNS; 40: narrower than any table with the long label."""
    report = _full_report(tmp_path, label)
    out = io.StringIO()
    print_table(report, make_console(width=width, file=out))
    text = out.getvalue()
    assert "…" not in text, text
    assert max(cell_len(line) for line in text.splitlines()) <= width, text
    flat = " ".join(text.split())  # a block's line may wrap at a space; a cut or folded figure never matches
    for cell in _whole(report):
        assert cell in flat, (cell, text)


def test_a_wide_terminal_shows_each_table_whole(tmp_path):
    """Where everything fits, each table is one table: one header row naming every column."""
    out = io.StringIO()
    print_table(_full_report(tmp_path, "long"), make_console(width=200, file=out))
    heads = [line for line in out.getvalue().splitlines() if "checkpoint" in line]
    assert len(heads) == 4, heads  # summary, repeats, recurrence, probe
    assert "first 10%" in out.getvalue() and out.getvalue().count("┏") == 4


@pytest.mark.parametrize("columns", [None, "80", "100"])
def test_a_file_gets_the_width_of_columns_or_80(tmp_path, capsys, monkeypatch, columns):
    """stdout a file or a pipe (pytest's capture): every line within COLUMNS, or rich's 80 without it, each
    figure whole, as on a terminal of that width."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    report = _full_report(tmp_path, LONG_LABEL)
    print_table(report)
    text = capsys.readouterr().out
    width = int(columns or 80)
    assert max(cell_len(line.rstrip()) for line in text.splitlines()) <= width, text
    flat = " ".join(text.split())
    for cell in _whole(report):
        assert cell in flat, (cell, text)
