"""The terminal view of an evaluation report: summary, repeat/unique and recurrence tables, trends, probe table."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table

from lcft.config import format_size
from lcft.console import make_console, styled
from lcft.evaluate.binning import THIN, thin_bins
from lcft.evaluate.stats import FEW_WINDOWS, context_text
from lcft.units import counted

ROUGH = "; with this few windows the intervals are rough"
REFERENCE = "reference"  # the first checkpoint's change column: the others' changes are against it


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def _pct_ci(rec: dict[str, Any]) -> str:
    """A relative change with its 95% interval, e.g. -0.42% [-0.90, +0.10]."""
    if rec.get("ci_low") is None or rec.get("ci_high") is None:
        return _pct(rec["relative_change"])
    return f"{_pct(rec['relative_change'])} [{100 * rec['ci_low']:+.2f}, {100 * rec['ci_high']:+.2f}]"


def table(report: dict[str, Any]) -> Table:
    """The terminal summary: overall loss, bits/base, first/last tenth, change vs the first checkpoint."""
    d = report["data"]
    rough = ROUGH if d["windows"] < FEW_WINDOWS else ""  # percentile intervals cover less than 95% then
    t = Table(title=f"held-out loss on {counted(d['windows'], d['split'] + ' window')} of "
                    f"{format_size(d['window_length'])} tokens{rough}", title_justify="left")
    t.add_column("checkpoint", no_wrap=True)
    # every header names its unit on a second line; the overall figures come first and the along-the-window ones
    # last, so a terminal too narrow for all of them shows each group as a table of its own (fitted)
    for col in ("context\ntokens", "loss\nnats/token", "loss\nbits/base",
                f"vs {report['checkpoints'][0]['label']} [95% CI]\n%", "first 10%\nnats/token", "last 10%\nnats/token",
                "last-first\nnats/token"):
        t.add_column(col, justify="right", no_wrap=True)
    for i, ck in enumerate(report["checkpoints"]):
        first, last = ck["first_tenth_loss"], ck["last_tenth_loss"]
        gap = None if first is None or last is None else last - first
        t.add_row(ck["label"], format_size(ck["max_context"]) if ck["max_context"] else "window",
                  _fmt(ck["loss"]), _fmt(ck["bits_per_base"], ".3f"), _pct_ci(ck) if i else REFERENCE, _fmt(first),
                  _fmt(last), _fmt(gap, "+.4f"))
    u = report["uniform"]
    t.add_row("uniform guess", "-", _fmt(u["loss"]), _fmt(u["bits_per_base"], ".3f"), "", _fmt(u["loss"]),
              _fmt(u["loss"]), "+0.0000", style="dim")
    return t


def _split_rows(report: dict[str, Any], title: str, a: str, b: str, names: tuple[str, str]) -> Table:
    """Subsets `a` and `b` of every checkpoint: the share of `a`, loss and change with its interval of each."""
    t = Table(title=title, title_justify="left")
    t.add_column("checkpoint", no_wrap=True)
    # the subset's name, the figure and its unit on lines of their own: narrow columns, one table in a log
    for col in (f"{names[0]}\nshare\n% of tokens", f"{names[0]}\nloss\nnats/token", f"{names[0]}\nchange [95% CI]\n%",
                f"{names[1]}\nloss\nnats/token", f"{names[1]}\nchange [95% CI]\n%"):
        t.add_column(col, justify="right", no_wrap=True)
    for i, ck in enumerate(report["checkpoints"]):
        x, y = ck[a], ck[b]
        share = x["tokens"] / ck["tokens"] if ck["tokens"] else None
        t.add_row(ck["label"], _fmt(share, ".1%"), _fmt(x["loss"]), _pct_ci(x) if i else REFERENCE, _fmt(y["loss"]),
                  _pct_ci(y) if i else REFERENCE)
    return t


def split_table(report: dict[str, Any]) -> Table | str:
    """Repeats (soft-masked predicted base) against unique sequence: loss and change with its interval; a
    one-line note instead when the windows hold no soft-masked base."""
    if not any(ck["repeat"]["tokens"] for ck in report["checkpoints"]):
        return "no soft-masked (lower-case) bases in these windows: no split into repeats and unique sequence"
    ref = report["checkpoints"][0]["label"]
    return _split_rows(report, f"repeats (lower case in the FASTA) and unique sequence; change vs {ref}",
                       "repeat", "unique", ("repeats", "unique"))


def recurrence_table(report: dict[str, Any]) -> Table | str:
    """Recurring tokens (their k-mer occurred earlier in the window) against the others: loss and change with
    its interval; a one-line note instead when no k-mer recurs."""
    k = report["recurrence"]["k"]
    if not any(ck["recurring"]["tokens"] for ck in report["checkpoints"]):
        return f"no {k}-mer occurs twice in any of these windows: no split into recurring and non-recurring tokens"
    ref = report["checkpoints"][0]["label"]
    return _split_rows(report, f"recurring (the {k}-mer ending at the token occurred earlier in the window) and "
                               f"non-recurring tokens; change vs {ref}", "recurring", "nonrecurring",
                       ("recurring", "non-recurring"))


def distance_line(report: dict[str, Any]) -> str | None:
    """How far back the recurring tokens' k-mers occurred: the distance histogram as shares of counted tokens."""
    rec, ck = report["recurrence"], report["checkpoints"][0]
    if not sum(rec["tokens"]) or not ck["tokens"]:
        return None
    e = rec["distance_edges"]
    # each class [e[c], e[c + 1]) as 'a-b'; the last is open-ended ('4K+'): its upper edge is only the longest
    # window (often no round size, as a model tokenizer's 4,244 bases) and the class takes anything farther
    labels = [f"{format_size(a)}-{format_size(b)}" for a, b in zip(e[:-2], e[1:-1], strict=True)]
    parts = [f"{label}: {n / ck['tokens']:.2%}" for label, n in zip([*labels, f"{format_size(e[-2])}+"],
                                                                      rec["tokens"], strict=True)]
    return (f"nearest earlier copy of the recurring tokens' {rec['k']}-mers, bases back (share of counted "
            f"tokens): {', '.join(parts)}")


def thin_line(report: dict[str, Any]) -> str | None:
    """Which position bins hold tokens of fewer than THIN of the windows (their figures average those windows
    only), when any does."""
    pos, n = report["positions"], report["data"]["windows"]
    thin = np.flatnonzero(thin_bins(pos["windows"], n))
    if not len(thin):
        return None
    return (f"{len(thin)} of {len(pos['edges']) - 1} position bins (the first from {pos['edges'][thin[0]]:,} "
            f"{pos['unit']}) hold tokens of fewer than {THIN:.0%} of the {counted(n, 'window')}: their figures "
            "average those windows only (shaded in the plot; eval.json positions.windows)")


def merged_line(report: dict[str, Any]) -> str | None:
    """How many position bins the report holds when that is fewer than --bins asked for (bins narrower than one
    position merged: `binning.bin_edges`)."""
    pos, asked = report["positions"], report["options"]["bins"]
    got = len(pos["edges"]) - 1
    if got >= asked:
        return None
    return (f"{got:,} position bins, not --bins {asked:,}: over {pos['edges'][-1]:,} {pos['unit']} the "
            f"{pos['bin_scale']} bins narrower than one position merge with the next (eval.json positions.edges)")


def probe_table(report: dict[str, Any]) -> Table | None:
    """Loss drop on the planted copy by distance (nats/token; * = above zero by its own 95% interval) and the
    effective context of each checkpoint; None without --probe."""
    opts = report.get("probe")
    if not opts:
        return None
    rough = ROUGH if opts["windows"] < FEW_WINDOWS else ""
    t = Table(title=f"copy probe: loss drop (nats/token) on a {opts['segment']}-token segment copied D tokens "
                    f"earlier, {counted(opts['windows'], 'window')} (* = above zero by its own 95% interval{rough}; "
                    f"effective context: the farthest above zero with the {len(opts['distances'])} distances tested "
                    "together by a sign-flip test over the windows; cannot tell: too few windows for them)",
              title_justify="left")
    t.add_column("checkpoint", no_wrap=True)
    for d in opts["distances"]:
        t.add_column(f"D={format_size(d)}\nnats/token", justify="right", no_wrap=True)
    t.add_column("effective context\ntokens", justify="right", no_wrap=True)
    if opts["mutation"] > 0:
        t.add_column(f"with {opts['mutation']:.0%} changed", justify="right", no_wrap=True)
    for ck in report["checkpoints"]:
        pr = ck["probe"]
        cells = [_fmt(v, "+.4f") + ("*" if lo is not None and lo > 0 else "")
                 for v, lo in zip(pr["drop"], pr["ci_low"], strict=True)]
        cells.append(context_text(pr["effective_context"], opts["windows"]))
        if "mutated" in pr:
            cells.append(context_text(pr["mutated"]["effective_context"], opts["windows"]))
        t.add_row(ck["label"], *cells)
    return t



def trend_lines(report: dict[str, Any]) -> list[str]:
    """One line per compared checkpoint: the slope of its change with log position, its interval, a verdict."""
    ref = report["checkpoints"][0]["label"]
    lines = []
    for ck in report["checkpoints"][1:]:
        tr = ck["trend"]
        if tr is None:
            continue
        if tr["slope_per_doubling"] is None:  # no slope to show: the verdict says why
            lines.append(f"{ck['label']} vs {ref}: trend {tr['verdict']}")
            continue
        lo, hi = (f"{100 * v:+.3f}" if v is not None else "-" for v in (tr["ci_low"], tr["ci_high"]))
        lines.append(f"{ck['label']} vs {ref}: change {100 * tr['slope_per_doubling']:+.3f}% per doubling of "
                     f"position [95% CI {lo}, {hi}]: {tr['verdict']}")
    return lines


def _width(console: Console, cell: RenderableType) -> int:
    """Columns `cell` takes on one line per line of its own (what a cell of a column that never wraps needs)."""
    return Measurement.get(console, console.options.update_width(10_000), cell).maximum


def fitted(table: Table, console: Console) -> list[RenderableType]:
    """`table` in the console's width with every figure and label whole: the table itself where it fits; else
    its columns in groups, each group a table after the first (label) column; else, where the label column and
    any one other do not fit, one block of 'header: value' lines per row."""
    cols = table.columns
    need = [max(_width(console, c) for c in (col.header, *col.cells)) + 3 for col in cols]  # + padding, border
    groups: list[list[int]] = []
    for i in range(1, len(cols)):
        if groups and 1 + need[0] + sum(need[j] for j in groups[-1]) + need[i] <= console.width:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) == 1:
        return [table]
    if 1 + need[0] + max(need[1:]) > console.width:
        return _blocks(table)
    parts: list[RenderableType] = []
    for n, group in enumerate(groups):
        t = Table(title=table.title if n == 0 else None, title_justify=table.title_justify)
        for i in (0, *group):
            t.add_column(cols[i].header, justify=cols[i].justify, no_wrap=True)
        cells = [list(c.cells) for c in cols]
        for r, row in enumerate(table.rows):
            t.add_row(*(cells[i][r] for i in (0, *group)), style=row.style)
        parts.append(t)
    return parts


def _blocks(table: Table) -> list[RenderableType]:
    """One block per row: its label, then each other column as 'header: value' (a header's lines joined)."""
    cols = table.columns
    cells = [list(c.cells) for c in cols]
    lines: list[RenderableType] = [str(table.title)] if table.title else []
    for r, row in enumerate(table.rows):
        style = str(row.style or "")
        lines.append(styled((str(cells[0][r]), style or "bold")))
        lines += [styled((f"  {' '.join(str(c.header).split())}: {cells[i][r]}", style))
                  for i, c in enumerate(cols) if i and cells[i][r] != ""]
    return lines


def _show(console: Console, what: Table | str, highlight: bool = False) -> None:
    for part in fitted(what, console) if isinstance(what, Table) else [what]:
        console.print(part, highlight=highlight)


def print_table(report: dict[str, Any], console: Console | None = None) -> None:
    """The summary table, the repeat/unique and recurring/non-recurring tables (with the distance histogram),
    the trend verdicts and (with --probe) the probe table, each fitted to the console's width."""
    if console is None:  # a terminal's width; a pipe's or a file's is COLUMNS, else rich's 80, fitted the same way
        console = make_console()
    _show(console, table(report), highlight=True)
    _show(console, split_table(report))
    if report.get("recurrence"):
        _show(console, recurrence_table(report))
        line = distance_line(report)
        if line:
            console.print(line, highlight=False)
    for line in [*trend_lines(report), thin_line(report), merged_line(report)]:
        if line:
            console.print(line, highlight=False)
    probe = probe_table(report)
    if probe is not None:
        _show(console, probe, highlight=True)
