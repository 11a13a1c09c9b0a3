"""The signals that ask a long job to stop (SIGTERM from a scheduler, SIGINT from a terminal): noted, not obeyed at
once, so that `lcft train` ends after its step's checkpoint and `lcft eval` after its batch's kept losses; the
command then exits 128 + N; a command that resumes from what it wrote (prepare) takes SIGTERM as a Ctrl-C.
SIGKILL still stops at once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from enum import StrEnum
from types import FrameType
from typing import Any

from lcft.errors import LcftError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Also what a launch stops workers with (the agent SIGTERMs the rest of a failed group; the launcher passes these
on): a worker they end was stopped, not lost."""


GROUP_ENDING_ENV = "LCFT_GROUP_ENDING"
"""Set by the launcher: a file where torchrun's agent names the workers (pids, one a line) it is about to SIGTERM
because their group failed or is restarted, not because anyone asked the run to stop (lcft.launch.agent)."""


def ended_with_group() -> bool:
    """Whether this process is one its launch's agent is ending with its group (GROUP_ENDING_ENV): the SIGTERM it
    got then asks nothing to be saved, and says nothing a worker would print about it."""
    path = os.environ.get(GROUP_ENDING_ENV)
    if not path:
        return False
    try:
        with open(path) as f:
            return str(os.getpid()) in f.read().split()
    except OSError:
        return False


def signal_name(signum: int) -> str:
    """The name of a valid signal number (signal.valid_signals()), a realtime one's too, which `signal.Signals`
    lacks (40: SIGRTMIN+6, as `kill -l 40` says): any of them may end a process."""
    if signal.SIGRTMIN < signum < signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    return signal.Signals(signum).name


class Ended(StrEnum):
    """How a run ended: summary.json's "stopped" (an evaluation's summary says only SIGNAL, when one stopped it)."""

    DONE = "done"
    STOP_AFTER = "stop_after"  # --stop-after steps were done, the run not
    SIGNAL = "signal"  # a stop signal, after its checkpoint (eval: its batch's losses)


def signal_fields(signum: int | None) -> dict[str, Any]:
    """A summary's "signal" (the name, for people) and "signal_number" (N of the exit code 128 + N) of the stop
    signal `signum`, both None when none stopped the run."""
    return {"signal": None if signum is None else signal_name(signum), "signal_number": signum}


def exit_code(summary: dict[str, Any]) -> int:
    """The process exit code of a finished command from its summary: 128 + N when signal N stopped the run
    (after its checkpoint), else 0."""
    return 128 + int(summary["signal_number"]) if summary.get("stopped") == Ended.SIGNAL else 0


class Stopped(LcftError):
    """Stopped by a signal: the workers ended before they could save (a second signal), or a demo stage stopped
    after its checkpoint (the demo ends there, not only the stage); exit code 128 + signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class Terminated(KeyboardInterrupt):
    """SIGTERM taken as a Ctrl-C (`terminate_as_interrupt`): the command unwinds, each cleanup run, and says so."""


def _terminated(_signum: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a repeat does not cut the unwinding short (SIGKILL still ends it)
    raise Terminated


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, a SIGTERM (a scheduler's time limit, `kill`) raises Terminated, a KeyboardInterrupt, in the main
    thread: a command that goes on from what it wrote (prepare) stops as after a Ctrl-C, with one line and exit
    143, where by default it would die where it stood without a word."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


_early: list[int] = []  # stop signals that came before a StopSignals was installed


def note_until_installed() -> None:
    """From now until a job installs its StopSignals, a stop signal is noted rather than obeyed, and that
    StopSignals takes it up: a launch's worker still importing torch would die of it (SIGTERM) or print a
    KeyboardInterrupt (SIGINT), where it should stop as it would a moment later."""
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, lambda signum, _frame: _early.append(signum))


class StopSignals:
    """While installed (main thread only: elsewhere signals cannot be caught), the first stop signal is noted in
    `signum` and `note(what)` says so; repeats are ignored (a launcher may pass on a signal the process also got
    from the terminal, and the work under way must not be cut short). The old handlers come back on `restore`."""

    def __init__(self, note: Callable[[str], None] | None = None, doing: str = "") -> None:
        self.signum: int | None = None
        self.note, self.doing = note, doing
        self._old: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
            if _early:  # (note_until_installed)
                self._handle(_early.pop(0), None)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            # A worker whose group the agent ends (another rank died) would say it saves, and then end unsaved.
            if self.note is not None and not ended_with_group():
                self.note(f"received {self.name}: {self.doing}")

    def agreed(self, largest: Callable[[int], int] | None = None) -> int:
        """The stop signal every rank of a job acts on: the highest number any rank noted, 0 for none, where
        `largest` takes the maximum of one value over the ranks (a collective: every rank calls this at the same
        point; None in a single process). A signal may reach one rank only (a node's launcher passing it on to its
        own workers): the others stop with it, under its name and exit code."""
        mine = self.signum or 0
        return largest(mine) if largest is not None else mine

    @property
    def name(self) -> str | None:
        return signal_name(self.signum) if self.signum is not None else None

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()
