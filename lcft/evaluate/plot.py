"""The eval report's plot (loss_by_position.png): loss by position per checkpoint, change against the reference with
its interval, and the soft-mask and recurrence splits, drawn from eval.json's content alone."""

from __future__ import annotations

import atexit
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from lcft.config import format_size
from lcft.errors import printable
from lcft.evaluate.binning import THIN, UNIFORM_BITS, thin_bins
from lcft.evaluate.recurrence import K
from lcft.units import counted

PANELS = ((("repeat", "repeats (soft-masked)", "-"), ("unique", "unique", "--")),
          (("recurring", f"recurring {K}-mers", "-"), ("nonrecurring", "non-recurring", "--")))
"""The split panels of the plot: each (subset, legend name, line style) pair, drawn only where it has tokens."""


def _series(values: list[float | None], scale: float = 1.0) -> np.ndarray:
    """A JSON list as floats for matplotlib: null (no tokens) as NaN, a gap in the line."""
    return np.array([np.nan if v is None else scale * v for v in values], dtype=np.float64)


def _change_panel(ax: Any, mid: np.ndarray, b: dict[str, Any], label: str, **style: Any) -> None:
    """One checkpoint's relative change by bin (%) with its 95% interval as a shaded band."""
    (line,) = ax.plot(mid, _series(b["relative_change"], 100), label=label, **style)
    ax.fill_between(mid, _series(b["ci_low"], 100), _series(b["ci_high"], 100), color=line.get_color(),
                    alpha=0.15, linewidth=0)


def _split_panels(report: dict[str, Any]) -> list[tuple[tuple[str, str, str], ...]]:
    """The split panels with data: a split whose first subset has no tokens in any compared checkpoint
    (e.g. no soft-masked base) gets no panel."""
    compared = report["checkpoints"][1:]
    return [p for p in PANELS if any(ck[p[0][0]]["tokens"] for ck in compared)]


def _guess_shown(report: dict[str, Any]) -> bool:
    """Whether the uniform guess's line goes in the top panel: only within half the curves' spread (at least
    0.1 bits/base) of them; drawn farther, it would stretch the axis and flatten the curves."""
    bits = np.concatenate([_series(ck["bins"]["bits_per_base"]) for ck in report["checkpoints"]])
    bits = bits[np.isfinite(bits)]
    if not bits.size:
        return True
    lo, hi = float(bits.min()), float(bits.max())
    margin = max((hi - lo) / 2, 0.1)
    return lo - margin <= UNIFORM_BITS <= hi + margin


def _usable(folder: Path) -> bool:
    """matplotlib's own test of its config or cache folder: made if missing, then a writable folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK) and folder.is_dir()


def _defaults_usable() -> bool:
    """Whether matplotlib's default config and cache folders pass its test (on Linux under $XDG_CONFIG_HOME and
    $XDG_CACHE_HOME, else ~/.config and ~/.cache; elsewhere ~/.matplotlib); no home folder at all fails it."""
    try:
        if not sys.platform.startswith(("linux", "freebsd")):
            return _usable(Path.home() / ".matplotlib")
        bases = (os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config",
                 os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # Path.home() without HOME or a password entry
        return False
    return all(_usable(Path(base, "matplotlib").resolve()) for base in bases)


def _config_folder() -> None:
    """MPLCONFIGDIR set, where the user has not set it and matplotlib's default folders cannot be made or written
    (a read-only home): else importing matplotlib makes a temporary one with a two-line warning and rebuilds its
    font list in every eval. The folder is matplotlib/ in lcft's cache where that is usable (the font list is kept
    for the next eval), else a private temporary folder removed at exit."""
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules or _defaults_usable():
        return
    from lcft.genomics.fasta_cache import cache_dir

    folder = cache_dir() / "matplotlib"
    if not _usable(folder):
        try:
            folder = Path(tempfile.mkdtemp(prefix="lcft-matplotlib-"))
        except OSError:  # no temporary folder either: matplotlib's own error says so
            return
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = str(folder)


def figure(report: dict[str, Any]) -> Any:
    """The plot as a matplotlib Figure: bits/base against position (one line per checkpoint, the uniform guess
    dashed where it is near them, else named in the title); below it the relative change of each other
    checkpoint against the first with its 95% interval as a band; then one panel per split with data, the same change in each of its subsets (solid, dashed). Its texts
    are shown as written: labels and the data folder's name are the user's, and '$' in one would be read as
    mathtext (an unknown symbol fails the whole plot)."""
    _config_folder()
    import matplotlib
    from matplotlib.text import Text

    matplotlib.use("Agg")  # no display; must precede pyplot's import
    with matplotlib.rc_context({"text.parse_math": False}):  # each Text keeps it: savefig later reads them as made
        fig = _figure(report)
    for text in fig.findobj(Text):  # a name's unprintable characters escaped: the font cannot draw a surrogate
        text.set_text(printable(text.get_text(), "\n"))  # (a non-UTF-8 byte of a folder name) and fails the plot
    return fig


def _figure(report: dict[str, Any]) -> Any:
    from matplotlib.figure import Figure

    edges = np.asarray(report["positions"]["edges"], dtype=np.float64)
    log = report["positions"]["bin_scale"] == "log"
    mid = np.sqrt(np.maximum(edges[:-1], 1) * edges[1:]) if log else (edges[:-1] + edges[1:]) / 2
    panels = _split_panels(report)
    fig = Figure(figsize=(9, 6 + 2 * len(panels)), dpi=100, layout="constrained")
    axes = fig.subplots(2 + len(panels), 1, sharex=True, height_ratios=(3, 2, *(2 for _ in panels)), squeeze=False)
    top, middle, splits = axes[0, 0], axes[1, 0], list(axes[2:, 0])
    ref = report["checkpoints"][0]["label"]
    for k, ck in enumerate(report["checkpoints"]):
        color = f"C{k}"
        top.plot(mid, _series(ck["bins"]["bits_per_base"]), marker=".", color=color, label=ck["label"])
        if k:  # the reference against itself is 0 by construction: the panel's grey zero line says it
            _change_panel(middle, mid, ck["bins"], f"{ck['label']} vs {ref}", marker=".", color=color)
        for ax, panel in zip(splits, panels, strict=True):
            for subset, name, style in panel:
                if k and ck[subset]["tokens"]:
                    _change_panel(ax, mid, ck[subset]["bins"], f"{ck['label']}: {name}", color=color, linestyle=style)
    guess = _guess_shown(report)
    if guess:
        top.axhline(UNIFORM_BITS, color="grey", linestyle="--", linewidth=1, label="uniform guess (2 bits/base)")
    top.set_ylabel("held-out loss (bits/base)")
    d = report["data"]
    top.set_title(f"{d['split']} split of {Path(d['folder']).name}: {counted(d['windows'], 'window')} of "
                  f"{format_size(d['window_length'])} tokens" + ("" if guess else "; uniform guess 2 bits/base, off "
                                                                  "this scale"))
    middle.set_ylabel(f"change vs {ref} (%)\n(band: 95% interval)")
    for ax, panel in zip(splits, panels, strict=True):
        ax.set_ylabel(f"change vs {ref} (%)\n{panel[0][1]} vs {panel[1][1]}")
    for k, b in enumerate(np.flatnonzero(thin_bins(report["positions"]["windows"], d["windows"]))):
        top.axvspan(edges[b], edges[b + 1], color="grey", alpha=0.15, linewidth=0,
                    label=f"tokens of fewer than {THIN:.0%} of the windows" if k == 0 else None)
    for ax in axes[:, 0]:  # beside the panel, never over a line's end (constrained layout makes the room)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    bottom = axes[-1, 0]
    bottom.set_xlabel(f"position in window ({report['positions'].get('unit', 'tokens')})")
    if log:
        bottom.set_xscale("log")
    for ax in axes[:, 0]:
        ax.grid(alpha=0.3)
    for ax in (middle, *splits):
        ax.axhline(0.0, color="grey", linewidth=1)
    return fig


def plot(report: dict[str, Any]) -> bytes:
    """PNG bytes of `figure(report)`."""
    buf = io.BytesIO()
    figure(report).savefig(buf, format="png")
    return buf.getvalue()
