"""The eval report: figures as a dict (eval.json), a CSV by position bin, a matplotlib plot, and a rich table."""

from __future__ import annotations

import contextlib
import csv
import datetime
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from lcft import __version__
from lcft.config import format_size, save_resolved, to_dict
from lcft.evaluate.binning import LN2, UNIFORM_LOSS, relative_change, tenths
from lcft.files import atomic_open

FORMAT_VERSION = 1
CSV_NAME, JSON_NAME, PNG_NAME, TOML_NAME = "loss_by_position.csv", "eval.json", "loss_by_position.png", "eval.toml"
CSV_COLUMNS = ("label", "bin", "start", "end", "tokens", "loss", "bits_per_base", "relative_change")


def _num(x: float) -> float | None:
    """JSON has no NaN: an undefined figure (a bin without tokens) is null."""
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def build_report(cfg: Any, ws: Any, n_windows: int, infos: list, results: list, edges: np.ndarray) -> dict[str, Any]:
    """Every figure of the evaluation as plain JSON-able data (see README: eval.json)."""
    length = ws.length
    (f0, f1), (l0, l1) = tenths(length)
    ref_bins, _ = results[0].sums.binned(edges)
    ref_loss = results[0].sums.mean()
    checkpoints = []
    for info, res in zip(infos, results, strict=True):
        means, counts = res.sums.binned(edges)
        loss_sum, tokens = res.sums.total()
        loss = loss_sum / tokens if tokens else math.nan
        rec = info.describe()
        rec.update({
            "tokens": tokens,
            "loss": _num(loss),
            "bits_per_base": _num(loss / LN2),
            "first_tenth_loss": _num(res.sums.range_mean(f0, f1)),
            "last_tenth_loss": _num(res.sums.range_mean(l0, l1)),
            "relative_change": _num(relative_change(loss, ref_loss)),
            "bins": {
                "loss": [_num(v) for v in means],
                "bits_per_base": [_num(v / LN2) for v in means],
                "tokens": [int(c) for c in counts],
                "relative_change": [_num(v) for v in relative_change(means, ref_bins)],
            },
            "windows": [{**w, "loss": _num(w["loss"])} for w in res.windows],
        })
        checkpoints.append(rec)
    return {
        "format_version": FORMAT_VERSION,
        "lcft_version": __version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "options": to_dict(cfg),
        "data": {
            "folder": str(cfg.data),
            "split": cfg.split,
            "window_length": length,
            "windows": n_windows,
            "windows_in_split": len(ws),
            "tokenizer": ws.manifest.get("tokenizer"),
        },
        "positions": {
            "note": "position p = index in the window of the predicted token (it sees the p tokens before it)",
            "bin_scale": cfg.bin_scale,
            "edges": [int(e) for e in edges],
            "first_tenth": [f0, f1],
            "last_tenth": [l0, l1],
        },
        "uniform": {"loss": UNIFORM_LOSS, "bits_per_base": UNIFORM_LOSS / LN2},
        "checkpoints": checkpoints,
    }


def csv_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (checkpoint, bin), the same figures as the JSON (empty cells for undefined figures)."""
    edges = report["positions"]["edges"]
    rows = []
    for ck in report["checkpoints"]:
        b = ck["bins"]
        for i in range(len(edges) - 1):
            rows.append({
                "label": ck["label"], "bin": i, "start": edges[i], "end": edges[i + 1],
                "tokens": b["tokens"][i], "loss": b["loss"][i], "bits_per_base": b["bits_per_base"][i],
                "relative_change": b["relative_change"][i],
            })
    return rows


def _atomic_write(path: Path, write: Any, mode: str = "w") -> None:
    with atomic_open(path, mode, **({"newline": ""} if mode == "w" else {})) as fh:
        write(fh)


def write_outputs(report: dict[str, Any], out: Path, cfg: Any) -> dict[str, Path]:
    """Write eval.json, loss_by_position.csv, loss_by_position.png and the resolved eval.toml atomically."""
    from lcft.errors import LcftError

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LcftError(f"cannot create output folder {out}: {e.strerror or e}") from None
    paths = {k: out / n for k, n in (("json", JSON_NAME), ("csv", CSV_NAME), ("png", PNG_NAME), ("toml", TOML_NAME))}

    def write_csv(fh: io.TextIOBase) -> None:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        for row in csv_rows(report):
            w.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()})

    png = plot(report)
    _atomic_write(paths["csv"], write_csv)
    _atomic_write(paths["png"], lambda fh: fh.write(png), mode="wb")
    save_resolved(paths["toml"], to_dict(cfg))
    # eval.json last: its presence means the report is complete.
    _atomic_write(paths["json"], lambda fh: json.dump(report, fh, indent=1, allow_nan=False))
    return paths


def plot(report: dict[str, Any]) -> bytes:
    """PNG bytes: bits/base against position (one line per checkpoint, the uniform guess dashed), and below
    it the relative change of each checkpoint against the first."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot's import
    from matplotlib.figure import Figure

    edges = np.asarray(report["positions"]["edges"], dtype=np.float64)
    log = report["positions"]["bin_scale"] == "log"
    mid = np.sqrt(np.maximum(edges[:-1], 1) * edges[1:]) if log else (edges[:-1] + edges[1:]) / 2
    fig = Figure(figsize=(9, 6.5), dpi=100, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    ref = report["checkpoints"][0]["label"]
    for ck in report["checkpoints"]:
        bpb = np.array([np.nan if v is None else v for v in ck["bins"]["bits_per_base"]])
        rel = np.array([np.nan if v is None else 100 * v for v in ck["bins"]["relative_change"]])
        top.plot(mid, bpb, marker=".", label=ck["label"])
        bottom.plot(mid, rel, marker=".", label=f"{ck['label']} vs {ref}")
    top.axhline(2.0, color="grey", linestyle="--", linewidth=1, label="uniform guess (2 bits/base)")
    top.set_ylabel("held-out loss (bits/base)")
    d = report["data"]
    top.set_title(f"{d['split']} split of {Path(d['folder']).name}: {d['windows']} windows of "
                  f"{format_size(d['window_length'])} tokens")
    top.legend(fontsize="small")
    bottom.axhline(0.0, color="grey", linewidth=1)
    bottom.set_ylabel(f"change vs {ref} (%)")
    bottom.set_xlabel("position in window (tokens)")
    if log:
        bottom.set_xscale("log")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def table(report: dict[str, Any]) -> Table:
    """The terminal summary: overall loss, bits/base, first/last tenth, change vs the first checkpoint."""
    d = report["data"]
    t = Table(title=f"held-out loss (nats/base unless noted) on {d['windows']} {d['split']} windows of "
                    f"{format_size(d['window_length'])} tokens", title_justify="left")
    t.add_column("checkpoint", no_wrap=True)
    for col in ("context", "loss", "bits/base", "first 10%", "last 10%", "last-first",
                f"vs {report['checkpoints'][0]['label']}"):
        t.add_column(col, justify="right", no_wrap=True)
    for ck in report["checkpoints"]:
        first, last = ck["first_tenth_loss"], ck["last_tenth_loss"]
        gap = None if first is None or last is None else last - first
        t.add_row(ck["label"], format_size(ck["max_context"]) if ck["max_context"] else "window",
                  _fmt(ck["loss"]), _fmt(ck["bits_per_base"], ".3f"), _fmt(first), _fmt(last),
                  _fmt(gap, "+.4f"), _pct(ck["relative_change"]))
    u = report["uniform"]
    t.add_row("uniform guess", "-", _fmt(u["loss"]), _fmt(u["bits_per_base"], ".3f"), _fmt(u["loss"]),
              _fmt(u["loss"]), "+0.0000", "", style="dim")
    return t


def print_table(report: dict[str, Any], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a log file: no terminal width to respect, keep rows on one line
            console = Console(width=120)
    console.print(table(report))


@contextlib.contextmanager
def progress_bar(show: bool) -> Iterator[Progress | None]:
    """A rich progress bar over windows (one task per checkpoint), or None when not shown."""
    if not show:
        yield None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("windows"), TimeRemainingColumn(), transient=False) as progress:
        yield progress
