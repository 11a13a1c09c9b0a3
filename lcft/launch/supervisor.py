"""The launcher's watch over torchrun's agent and its workers (`Supervisor`): it passes stop signals on, ends
everything at once on a second one, a frozen worker, a lost rank that no restart follows or a rank's user error, and
says why the agent restarts the group when it does."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from lcft.launch.process import FAILURES_ENV, Handed, handed_over, killed_workers, ready
from lcft.liveness import NODE_RANK_ENV, read_report
from lcft.signals import STOP_SIGNALS, Stopped, signal_name


class Supervisor:
    """Runs torchrun in its own session and stands between it and the signals sent to this process.

    In its own session a Ctrl-C on the terminal reaches only this process, which signals the workers itself.
    Signalling torchrun instead would make it kill the workers (SIGKILL after 30 s), possibly in the middle of
    their final checkpoint. A second signal, or a frozen worker (which could never save), ends everything at
    once; so does a stop signal while the agent waits for the other nodes (no worker started yet), a worker's
    diagnosis of a lost rank when no restart will follow (torchrun would otherwise wait 30 s for a frozen process
    it cannot stop with SIGTERM), and a rank's user error (`_user_errors`). Under
    --max-restarts it says why the agent restarted the group, once it did (`_restarting`).
    """

    POLL_S = 0.2
    LOST_GRACE_S = 3.0  # after a worker reported a lost rank, let torchrun end the group by itself this long
    ERROR_GRACE_S = 2.0  # after a rank's user error, the most it waits for the node's other ranks to raise theirs

    def __init__(self, cmd: list[str], env: dict[str, str], failure: Path, errors: Path | None, nproc: int,
                 elastic: bool, resume: str, gathers: bool = False, ready: Path | None = None) -> None:
        self.cmd, self.env, self.failure, self.elastic, self.resume = cmd, env, failure, elastic, resume
        self.ready = ready  # where the workers say their stop handler is set (process.say_ready); None: all are
        self.errors, self.nproc = errors, nproc
        self.gathers = gathers  # the agent first waits at the rendezvous for the other nodes (--nnodes)
        self.heard: Handed | None = None  # the latest user error a rank handed over
        self.heard_at: float | None = None  # when the first of the ranks' errors came
        self.said: Handed | None = None  # the one it ended the launch on
        self.signals: list[int] = []
        self.stop: int | None = None  # the first stop signal, passed on to every worker, those started later too
        self.told: set[int] = set()  # pids of the workers it was passed on to
        self.killed_by: int | None = None
        self.ended = False  # True once _kill ended the agent and the workers (before they started: a stop signal)
        self.started = False  # True once the agent had workers: a rendezvous error before it is no lost run
        self.seen: set[int] = set()  # pids of every worker seen (a restart's are new)
        # where the agent records the failed workers of each failed group (a restart's too), and this node's rank
        self.failures = Path(env[FAILURES_ENV]) if FAILURES_ENV in env else None
        self.node = env.get(NODE_RANK_ENV, "0")

    def run(self) -> int:
        # signal.signal works only in the main thread; elsewhere the workers simply get no forwarded signals.
        # Taken before torchrun starts: a signal in between ended this process by default and left torchrun,
        # in a session of its own, training as an orphan.
        main = threading.current_thread() is threading.main_thread()
        old = {s: signal.signal(s, lambda n, _f: self.signals.append(n)) for s in STOP_SIGNALS
               } if main else {}
        try:
            self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True)
            return self._wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _wait(self) -> int:
        reported_at: float | None = None
        while True:
            try:
                rc = self.proc.wait(timeout=self.POLL_S)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                if self.killed_by is not None:
                    raise Stopped(f"stopped by a second {signal_name(self.killed_by)} before the workers "
                                  f"saved; {self.resume}", self.killed_by)
                return rc
            # The agent's own children, the workers it starts (not theirs: a DataLoader's, a compile worker, which
            # are no restart); taken before the report is read (`_restarting`).
            workers = {w.pid for w in self._workers(recursive=False)}
            self.started = self.started or bool(workers)
            if not self.ended:  # (before the signals: one that comes while a user error waits ends on it)
                self._user_errors()
            while self.signals:
                self._signalled(self.signals.pop(0))
            if self.stop is not None and not self.ended:  # a worker not yet started when it came gets it too
                self._forward(self.stop)
            report = None if self.ended else read_report(self.failure)
            if self.elastic and not self.ended:  # the agent may restart the group
                self._restarting(report, workers)
            elif report is not None:
                if reported_at is None:
                    reported_at = time.monotonic()
                elif time.monotonic() - reported_at > self.LOST_GRACE_S:
                    self._kill()
            self.seen |= workers

    def _restarting(self, report: str | None, workers: set[int]) -> None:
        """Under --max-restarts, why the agent restarted the group: a worker of this node killed by a signal, as
        the agent recorded it (the launch's error names it so without restarts), else a worker's diagnosis of a
        lost rank (`report`). Said once the agent started new workers, and cleared then for the new round's; kept
        for the launch to raise when the agent gives up instead (its restarts spent, or the rendezvous closed), as
        without --max-restarts."""
        if not workers - self.seen:  # (both are written before the agent restarts the group)
            return
        killed = killed_workers(self.failures, self.node, self.resume) if self.failures is not None else None
        if (said := killed or report) is None:
            return
        # Without the job's resume, which says to start the run again: it goes on by itself.
        print(f"restarting: {said.removesuffix(f'; {self.resume}')}", file=sys.stderr, flush=True)
        self.failure.unlink(missing_ok=True)
        if self.failures is not None:
            self.failures.unlink(missing_ok=True)

    def _signalled(self, signum: int) -> None:
        """A stop signal: the first is passed on to the workers, a second ends them at once, and so does one that
        comes while a rank's user error waits for the other ranks' (`_user_errors`): the launch ends on that
        error, the cause, which saving would not mend."""
        if self.ended:  # ending already, on its own cause
            return
        if self.heard_at is not None:
            self.said = self.heard
            self._kill()
        elif self.stop is not None:
            print(f"second {signal_name(signum)}: ending the workers now, before they saved",
                  file=sys.stderr, flush=True)
            self.killed_by = signum
            self._kill()
        else:
            self.stop = signum
            if self.gathers and not self.started:  # the agent would wait for the nodes (the join timeout), then
                self._kill()  # start the workers only to stop them; nothing to save yet

    def _user_errors(self) -> None:
        """The user errors ranks handed over, each waiting in the process group (lcft/launch/__main__.py): once
        every rank of this node raised one (the same check) or had finished its work, or ERROR_GRACE_S after the
        first (the others wait in a collective), everything is ended at once, before a rank sees another go
        (gloo's errors; a restart: a rerun fails the same way), and the launch raises rank 0's error, else the
        first one's, with its exit code. Unless a worker of this node ended before its work was done: an error
        may then be its consequence (a collective load torn by a rank the OOM killer ended), and torchrun ends
        the launch, its agent naming that worker."""
        handed = handed_over(self.errors) if self.errors is not None else []
        errors = [h for h in handed if h.exit_code != 0]
        if not errors:
            return
        self.heard = errors[0]
        running = [w for w in self._workers(recursive=False) if _status(w) not in (None, psutil.STATUS_ZOMBIE)]
        finished = {h.pid for h in handed if h.exit_code == 0}  # (one may still be running: counted once)
        if len({w.pid for w in running} | finished) < self.nproc:
            for h in handed:  # a restarted group's are heard anew
                (self.errors / str(h.rank)).unlink(missing_ok=True)
            self.heard_at = None  # (`heard` stays: torchrun's failure line then says it, as nothing printed it)
            return
        self.heard_at = self.heard_at or time.monotonic()
        if len(handed) >= self.nproc or time.monotonic() - self.heard_at > self.ERROR_GRACE_S:
            self.said = self.heard
            self._kill()

    def _workers(self, recursive: bool = True) -> list[psutil.Process]:
        """The agent's workers, and (recursive) every process they started. From each process's parent, skipping
        those it may not read: psutil's children() fails on the first (another user's under /proc's hidepid=1)."""
        below: dict[int, list[psutil.Process]] = {}
        for p in psutil.process_iter(["ppid"], ad_value=None):  # (gone ones are left out)
            below.setdefault(p.info["ppid"], []).append(p)
        found, parents = [], [self.proc.pid]
        while parents:
            children = below.get(parents.pop(0), [])  # breadth first, as psutil's
            found += children
            parents += [c.pid for c in children] if recursive else []
        return found

    def _forward(self, signum: int) -> None:
        """Pass the signal to every worker not yet told once its stop handler is set (a worker still starting,
        a restart's too, would die of it, and the agent restart the group), unless one is frozen: then nothing
        can be saved, end them all. Called on every poll until the launch ends, and a worker frozen after it was
        told counts too (SIGSTOP lands when a process is next scheduled, or comes a moment later): the others
        would wait for it in their save's collective until the collective timeout."""
        everyone = self._workers()  # (a worker's own processes too: a frozen DataLoader holds its worker up)
        frozen = [w for w in everyone if _status(w) == psutil.STATUS_STOPPED]  # (a finished one is a zombie)
        workers = [w for w in everyone if w.pid not in self.told]
        if self.ready is not None:  # (a worker's own processes, started after its handler was set, are told)
            starting = {w.pid for w in self._workers(recursive=False)} - ready(self.ready)
            workers = [w for w in workers if w.pid not in starting]
        if frozen:
            ranks = ", ".join(_describe(w) for w in frozen)
            if not self.failure.exists():  # a worker's own diagnosis comes first
                self.failure.write_text(f"{ranks} is stopped (frozen, e.g. SIGSTOP) and cannot save; ended on "
                                        f"{signal_name(signum)}; {self.resume}\n")
            self._kill()
            return
        for w in workers:
            self.told.add(w.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                w.send_signal(signum)

    def _kill(self) -> None:
        """SIGKILL torchrun and its workers (each in a session of its own), every one stopped first (SIGSTOP; a
        stopped process takes SIGKILL too): none sees another end, and prints about it, before it ends itself."""
        self.ended = True
        everyone = [psutil.Process(self.proc.pid), *self._workers()]
        for signum in (signal.SIGSTOP, signal.SIGKILL):
            for p in everyone:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signum)


def _status(p: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        return p.status()
    return None


def _describe(p: psutil.Process) -> str:
    """'rank R on node N (pid P)' of a worker process, from the environment torchrun gave it."""
    with contextlib.suppress(psutil.Error):
        env = p.environ()
        if "RANK" in env:
            return f"rank {env['RANK']} on node {env.get(NODE_RANK_ENV, '0')} (pid {p.pid})"
    return f"pid {p.pid}"
