"""Terminal output that prints text as it is: every rich Console and progress-bar text column of lcft is made
here, with markup off and unprintable characters escaped, and the progress bars' time columns. Names from handed files (FASTA records, chromosome
names, tokenizer and checkpoint names, paths) reach tables, titles and progress bars; read as markup, '[/]' in
one is a MarkupError traceback and '[bold]' restyles the output, and a terminal escape in one would drive the
terminal. lcft's own styling is given as styles (`styled`), never as markup."""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import IO, Any

from rich.console import Console
from rich.progress import ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text

from lcft.errors import printable

LINES = "\n\t"  # what a printed text may hold besides printable characters
PIPE_CLOSED = 128 + signal.SIGPIPE  # the exit status of `cat` whose reader went away (141)


class PlainConsole(Console):
    """A Console that never reads markup and escapes unprintable characters of every string it renders
    (tables, titles, prints of plain strings show them as written)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._width is not None and self._width < 1:  # COLUMNS=0: rich would print nothing, errors included
            self._width = None  # the terminal's width, or 80

    def render_str(self, text: str, **kwargs: Any) -> Text:
        text = printable(text, LINES)
        if not self.encoding.lower().startswith("utf"):  # escaped before it is measured: tables stay aligned
            text = text.encode(self.encoding, "backslashreplace").decode(self.encoding)
        return super().render_str(text, **kwargs)

    def on_broken_pipe(self) -> None:
        """Its reader went away (`lcft ... | head -1`): end quietly, as `cat` does. rich's own handler exits 1,
        which here means a user error, and points stdout at /dev/null even when the closed pipe is stderr."""
        self.quiet = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self.file.fileno())  # the final flush at exit must not fail again
        os.close(null)
        raise SystemExit(PIPE_CLOSED)


class PlainTextColumn(TextColumn):
    """A progress column of text (`{task.description}`...: a chromosome's or a checkpoint's name) without markup,
    unprintable characters escaped."""

    def render(self, task: Task) -> Text:
        text = super().render(task)
        return Text(printable(text.plain), style=text.style, justify=text.justify)


def make_console(stderr: bool = False, width: int | None = None, file: IO[str] | None = None) -> Console:
    return PlainConsole(stderr=stderr, width=width, markup=False, file=file)


def text_column(template: str, style: str = "") -> TextColumn:
    return PlainTextColumn(template, style=style, markup=False)


def time_left_column() -> TimeRemainingColumn:
    """A bar's time left while it runs and the time it took once finished: a log then shows how long each
    chromosome or checkpoint took, not the 0:00:00 left."""
    return TimeRemainingColumn(elapsed_when_finished=True)


def hms(seconds: float | None) -> str:
    """h:mm:ss as rich's time columns print it (hours past 24 too); -:--:-- while unknown."""
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}"


def mean_time_left(elapsed: float | None, done: int, left: int) -> float | None:
    """The time `left` more items take at the mean time of the `done` ones so far; None before the first is done."""
    return elapsed / done * left if done > 0 and elapsed is not None else None


class MeanTimeLeftColumn(ProgressColumn):
    """ETA from the mean time per item since the task started, its field `before` the items done before then.
    rich's own estimate looks only at the updates of the last 30 s: with steps of minutes it never showed one."""

    def render(self, task: Task) -> Text:
        done = int(task.completed - task.fields.get("before", 0))
        left = int(task.total - task.completed) if task.total is not None else 0
        return Text(hms(mean_time_left(task.elapsed, done, left)), style="progress.remaining")


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line from plain and (text, style) parts: lcft's own emphasis around names it prints as written."""
    return Text.assemble(*((printable(p[0], LINES), p[1]) if isinstance(p, tuple) else printable(p, LINES)
                           for p in parts))


def zero_columns() -> None:
    """A COLUMNS of 0 in the environment is dropped, once as the CLI starts: typer's help, which makes its own
    rich Console, would print nothing at all (lcft's consoles, PlainConsole, ignore it)."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) == 0:  # (rich reads only digits: anything else is ignored already)
        del os.environ["COLUMNS"]


def standard_streams() -> None:
    """Make the standard streams safe to write to, once as the CLI starts. A descriptor 0-2 the shell closed
    (`>&-`, `<&-`) is opened on /dev/null: else the next file lcft opens takes its number, and whatever writes to
    'stdout' (a library's C code, a worker process inheriting it) writes into that file, while sys.stdout is None
    for Python code. stdout and stderr escape what their encoding cannot hold (a non-ASCII record name or path under
    PYTHONIOENCODING=ascii) instead of failing mid-output."""
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, mode)  # the lowest free number: `fd` itself when the lower ones are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:  # Python found the descriptor closed at start
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115 (the process's)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def failed_stream(e: OSError) -> str | None:
    """"standard output" / "standard error" when `e` was raised writing to that stream (the innermost frame of its
    traceback held the stream: rich's and click's writers, print): a full disk or quota under a job's log file,
    /dev/full; None otherwise."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    held = list(tb.tb_frame.f_locals.values())
    held += [getattr(v, "file", None) for v in held if isinstance(v, Console)]
    for stream, name in ((sys.stdout, "standard output"), (sys.stderr, "standard error")):
        if any(v is stream for v in held):
            return name
    return None


def quiet_streams() -> None:
    """Standard output and error pointed at /dev/null: the interpreter's final flush of what they still buffer
    must not fail again (after a write fault was said, or a reader went away)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


def stdout_identity() -> tuple[int, int]:
    """What file descriptor 1 is (device, inode): a closed pipe's handlers put /dev/null in its place."""
    st = os.fstat(1)
    return st.st_dev, st.st_ino


def say_on_stderr(message: str) -> None:
    """A note for the user on stderr, flushed (a command's `say` where it has no console of its own)."""
    print(message, file=sys.stderr, flush=True)
