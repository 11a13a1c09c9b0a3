"""Per-step metrics: metrics.jsonl (one JSON object per step), peak memory, and the progress view (bar or log lines)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TimeElapsedColumn,
)
from rich.text import Text

from lcft.console import MeanTimeLeftColumn, hms, make_console, mean_time_left, text_column
from lcft.disk import write_faults
from lcft.errors import LcftError, reason
from lcft.files import atomic_write, parse_json
from lcft.train.run_dir import METRICS


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated accelerator memory on CUDA; peak resident set size of this process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # VmHWM is this process's own high-water mark. ru_maxrss is not: Linux carries the parent's peak over
    # fork + exec, so a run started from a large process (a test runner, a notebook) reported the parent's.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB
    return int(rss_kib) * 1024


class MetricsLog:
    """Appends one JSON line per step to <run>/metrics.jsonl, flushed at once (a crash loses no step)."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None) -> None:
        self.path = Path(path)
        with write_faults(self.path):  # the rewrite on resume, on a full disk: one line, the old file kept
            if resume_step is not None and self.path.exists():
                self._truncate_after(resume_step)
            elif resume_step is None and self.path.exists():
                self.path.unlink()  # a new run in this folder (the trainer checked nothing would be lost)
            self._f = open(self.path, "a", buffering=1)

    def _truncate_after(self, step: int) -> None:
        """Drop records of steps after the checkpoint we resume from: they are recomputed. A file this user cannot
        read is one line naming it."""
        try:
            text = self.path.read_text(errors="replace")
        except OSError as e:
            raise LcftError(f"{self.path}: cannot read it to resume the run ({e.strerror or reason(e)})") from None
        keep = []
        for line in text.splitlines():
            try:
                record = parse_json(line, str(self.path))
            except LcftError:
                continue  # a line cut by a crash (or garbled: not JSON, nested too deep)
            at = record.get("step", 0) if isinstance(record, dict) else None
            if isinstance(at, int | float) and not isinstance(at, bool) and at <= step:
                keep.append(line)  # (not a step record, or garbled: dropped like a cut line)
        atomic_write(self.path, "".join(line + "\n" for line in keep))

    def write(self, record: dict[str, Any]) -> None:
        with write_faults(self.path):  # a full disk or a file-size limit: one line, the run stops there
            self._f.write(json.dumps(record, allow_nan=True) + "\n")

    def close(self) -> None:
        # each line was flushed as written: what is left is the rest of a line whose write failed, reported then
        with contextlib.suppress(OSError):
            self._f.close()


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of <run>/metrics.jsonl."""
    p = Path(run_dir) / METRICS
    lines = p.read_text().splitlines() if p.exists() else []
    return [parse_json(line, f"{p} line {n}") for n, line in enumerate(lines, 1) if line.strip()]


def _figures(record: dict[str, Any]) -> list[tuple[int, str]]:
    """The figures of one step record in display order, each with its rank: the line drops the highest rank
    first when the terminal is too narrow. Loss is never dropped; a skipped count above 0 is a warning and goes
    last; bits/base restates the loss in another unit and lr follows the schedule, so they go first."""
    skipped = record["skipped"]
    return [(0, f"loss {record['loss']:.4f} nats/token"),
            (5, f"{record['bits_per_base']:.3f} bits/base"),
            (6, f"lr {record['lr']:.2e}"),
            (4, f"grad norm {record['grad_norm']:.3g}"),
            (2, f"{record['tokens_per_s']:,.0f} tok/s"),
            (3, f"peak {record['peak_mem'] / 2**30:.2f} GiB"),
            (1 if skipped else 7, f"skipped {skipped}")]


def figures_line(record: dict[str, Any], width: int) -> str:
    """The figures below the progress bar, within `width` columns: the least useful figures are left out
    until the line fits (a wrapped line would push the bar up and leave copies of it on the terminal)."""
    if record.get("loss") is None:
        return ""
    parts = _figures(record)
    for rank in sorted({r for r, _ in parts if r > 0}, reverse=True):
        if len(" · ".join(text for _, text in parts)) <= width:
            break
        parts = [(r, text) for r, text in parts if r != rank]
    line = " · ".join(text for _, text in parts)
    return line if len(line) <= width else line[:max(width - 1, 0)] + "…"


class _Figures:
    """The latest step's figures, fitted to the width of each render (the terminal may be resized)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(figures_line(self.record, options.max_width), no_wrap=True, overflow="crop")


class LiveView:
    """Training progress on rank 0, nothing when disabled. On a terminal (stdout): a rich bar (steps, elapsed,
    ETA) with the latest figures on the line below. Where stderr is not a terminal (a batch job's log), or no bar
    is drawn, a plain line on stderr: every step of the first FIRST_LINES, then at most one a LINE_EVERY_S seconds,
    and the last step written; a log of a days-long run stays short while its first lines show at once that it
    runs, how fast, and what its first step cost."""

    FIRST_LINES = 5
    LINE_EVERY_S = 60.0

    def __init__(self, enabled: bool, total: int, done: int, console: Console | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled and sys.stdout.isatty()
        self.total, self.done, self.clock, self.stream = total, done, clock, stream or sys.stderr
        self.lines = enabled and not (self.enabled and self.stream.isatty())
        self._t0 = self._last_line = clock()
        self._pending = ""  # the latest step's line when it was not written (written at close)
        self._live: Live | None = None
        if not self.enabled:
            return
        self._progress = Progress(text_column("train", "bold"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  text_column("ETA"), MeanTimeLeftColumn(), get_time=clock)
        self._task = self._progress.add_task("train", total=total, completed=done, before=done)
        self._figures = _Figures()
        self._live = Live(Group(self._progress, self._figures), console=console or make_console(), refresh_per_second=4)
        self._live.start()

    def update(self, step: int, record: dict[str, Any]) -> None:
        if self._live is not None:
            self._progress.update(self._task, completed=step)
            self._figures.record = record
        if self.lines:
            now = self.clock()
            elapsed = now - self._t0
            eta = mean_time_left(elapsed, step - self.done, self.total - step)
            self._pending = (f"train step {step}/{self.total} · {figures_line(record, sys.maxsize)} · "
                             f"elapsed {hms(elapsed)} · ETA {hms(eta)}")
            if step - self.done <= self.FIRST_LINES or step >= self.total or now - self._last_line >= self.LINE_EVERY_S:
                self._write_line(now)

    def _write_line(self, now: float) -> None:
        print(self._pending, file=self.stream, flush=True)
        self._pending, self._last_line = "", now

    def note(self, message: str) -> None:
        """A line printed above the live view (or to stderr without one)."""
        if self._live is not None:
            self._live.console.print(message, highlight=False)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._pending:  # a stopped run's log ends with its last step
            self._write_line(self.clock())
        if self._live is not None:
            self._live.stop()
            self._live = None
