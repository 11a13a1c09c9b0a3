"""What the launcher, torchrun's agent and the workers share of a launch's processes: the files the launcher
names in their environment, what a rank hands over in its folder, the agent's own exit codes, and ending with the
parent."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
from pathlib import Path
from typing import NamedTuple

from lcft.files import atomic_write
from lcft.liveness import own_restarts
from lcft.spare_room import unwritable, write_back

HANDED_ENV = "LCFT_HANDED_OVER"  # set by the launcher: the folder where each rank says how its work ended (file: RANK)
FAILURES_ENV = "LCFT_WORKER_FAILURES"  # set by the launcher: where the agent writes the failed workers
READY_ENV = "LCFT_READY"  # set by the launcher: the folder where each worker says its stop handler is set (file: PID)
_PR_SET_PDEATHSIG = 1  # prctl(2)
RESULT_FILE_ENV = "LCFT_RESULT_FILE"  # set by the launcher: where rank 0 hands back its summary
PARENT_ENV = "LCFT_PARENT_PID"  # set by the launcher (its pid) for the agent, and by the agent for the workers
EXIT_NOT_GATHERED = 3
"""The agent's exit code when the rendezvous did not gather --nnodes nodes within its join timeout (no other exit of
the agent's: 0, 1, argparse's 2, 75, 128 + N); the launcher names it (lcft.launch._agent_ended)."""


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux prctl PR_SET_PDEATHSIG), so that a
    launcher killed by SIGKILL (the OOM killer, a scheduler) leaves no agent and no worker behind. A parent gone
    before that took effect (while this process was still starting) ends it at once: its pid, which the parent
    put in PARENT_ENV, is no longer this process's parent's. Its own children are told this process's pid."""
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect: orphaned, reparented
        os._exit(1)
    os.environ[PARENT_ENV] = str(os.getpid())


def say_ready() -> None:
    """Tell the launcher (READY_ENV's folder) that this worker notes a stop signal now rather than dying of it: the
    launcher passes a stop on only then. No-op outside a launch. LcftError when the folder cannot take it (a full
    or read-only temporary file system): such a worker would never be told a stop, and train on past its
    scheduler's SIGTERM and the user's Ctrl-C, so it refuses to start its work."""
    if folder := os.environ.get(READY_ENV):
        try:
            (Path(folder) / str(os.getpid())).touch()
        except OSError as e:
            raise unwritable(folder, e, "a stop signal could not be passed on to the workers") from None


def ready(folder: Path) -> set[int]:
    """The pids of the workers that said their stop handler is set (`say_ready`)."""
    with contextlib.suppress(OSError):
        return {int(n) for n in os.listdir(folder) if n.isdecimal()}
    return set()


class Handed(NamedTuple):
    """How one rank's work ended, as it handed it over: exit code 0 (finished), or its user error's exit code and
    one-line message."""

    rank: int
    round: int  # the agent's restart of the group the rank ran in (liveness.own_restarts: one node's agent)
    exit_code: int
    message: str
    when: int  # (ns) when it was written
    pid: int  # the worker process that wrote it


def hand_over(folder: str | os.PathLike, rank: int, exit_code: int, message: str = "") -> None:
    """Write how this rank's work ended into the launcher's folder, whole or not at all; OSError when the folder
    cannot take it."""
    record = {"round": own_restarts(), "exit_code": exit_code, "message": message, "pid": os.getpid()}
    write_back(lambda: atomic_write(Path(folder) / str(rank), json.dumps(record)))


def handed_over(folder: Path) -> list[Handed]:
    """What the ranks of the latest round handed over into `folder` (an earlier round's are stale: the group was
    restarted), rank 0's first, then by time."""
    handed = []
    for path in folder.iterdir():
        if not path.name.isdecimal():  # (atomic_write's temporary files)
            continue
        with contextlib.suppress(FileNotFoundError):  # (taken away since the listing)
            record, when = json.loads(path.read_text()), path.stat().st_mtime_ns
            handed.append(Handed(int(path.name), record["round"], record["exit_code"], record["message"], when,
                                 record["pid"]))
    latest = max((h.round for h in handed), default=0)
    return sorted((h for h in handed if h.round == latest), key=lambda h: (h.rank != 0, h.when, h.rank))


def killed_workers(path: Path, node: int | str, resume: str) -> str | None:
    """A one-line diagnosis when the agent saw a worker killed by a signal (SIGKILL: the OOM killer, a
    scheduler), from the failures it recorded, ending in the job's `resume`; None when every failed worker
    exited by itself."""
    with contextlib.suppress(OSError, ValueError):
        failed = [f for f in json.loads(path.read_text()) if f.get("signal") and not f.get("stopped")]
        if failed:
            who = ", ".join(f"rank {f['rank']} on node {node} (pid {f['pid']}) was killed by {f['signal']}"
                            for f in failed)
            return f"{who}; {resume}"
    return None
