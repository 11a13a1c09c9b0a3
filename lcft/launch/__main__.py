"""Worker entry of `--nproc N`: `python -m lcft.launch JOB SPEC.toml`, started once per rank by torchrun."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback

from lcft import liveness
from lcft.errors import LcftError
from lcft.files import atomic_write
from lcft.launch.jobs import JOBS
from lcft.launch.process import (
    HANDED_ENV,
    RESULT_FILE_ENV,
    die_with_parent,
    hand_over,
    say_ready,
)
from lcft.signals import StopSignals, note_until_installed
from lcft.spare_room import unwritable, write_back

HAND_OVER_S = 10.0
"""How long a rank that handed its user error to the launcher waits to be ended with the others (the launcher
waits at most 2 s for the other ranks of its node); then it exits 1 by itself, as it does when a stop signal
comes first."""


def main(argv: list[str] | None = None) -> int:
    """Load JOB's config from SPEC.toml and run it on this rank; the node's first rank (local rank 0) hands its
    summary back to the launcher (the file RESULT_FILE_ENV names), and every rank says it finished. On a user
    error: 1 once handed to the launcher (which raises it with its exit code); else, printed by rank 0, the error's
    own exit code (several nodes with --max-restarts, whose agents restart the group: its workers' exit codes are
    what they record)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in JOBS:
        print(f"usage: python -m lcft.launch {{{','.join(JOBS)}}} CONFIG.toml "
              "(started by `lcft train|eval --nproc N`)", file=sys.stderr)
        return 2
    name, spec = args
    note_until_installed()  # a stop passed on while this worker imports is taken up by the job
    rank = int(os.environ.get("RANK", "0"))
    try:
        say_ready()  # (the launcher holds a stop back until then: before, it would end this process)
        entry = JOBS[name].entry()
        summary = entry.work(entry.resolve(entry.load(spec)))
        if os.environ.get("LOCAL_RANK", "0") == "0" and (result := os.environ.get(RESULT_FILE_ENV)):
            # Each node's launcher hears how the run ended from its own first rank, with no shared file system: the
            # ranks agreed on it (a signal stops every rank under one name). Rank 0's is the run's summary; another
            # node's says which node it was (rank 0, elsewhere, wrote the run's files).
            mine = summary if rank == 0 else {**summary, "node_rank": int(os.environ[liveness.NODE_RANK_ENV])}
            _hand_back(result, json.dumps(mine, default=str))
        if folder := os.environ.get(HANDED_ENV):
            # Finished, not failed: a user error another rank raises after this one ended is no consequence of it.
            with contextlib.suppress(OSError):  # (then as an ended worker: that rank's error waits to be heard)
                hand_over(folder, rank, 0)
    except LcftError as e:
        if _hand_over(e, rank):
            return 1
        if rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:
        # A collective that failed or timed out because another rank stopped: name it instead of a traceback.
        lost = liveness.diagnose(e, JOBS[name].resume)
        if lost is None:
            raise
        liveness.report(*lost)
        return liveness.EXIT_LOST
    finally:
        liveness.stop()
        _destroy_process_group()
    return 0


def _hand_back(result: str, summary: str) -> None:
    """Write the summary into the launcher's file; LcftError when its folder cannot take it, even with the
    launcher's spare room freed (the work is done, its files written: only how it ended cannot be told)."""
    try:
        write_back(lambda: atomic_write(result, summary))
    except OSError as e:
        raise unwritable(os.path.dirname(result), e, "the work finished, but how it ended could not be handed "
                         "back to the launcher") from None


def _hand_over(error: LcftError, rank: int) -> bool:
    """Give the launcher this rank's user error (its message and exit code) and wait, still in the process
    group, for the launcher to end every process of the launch at once: a rank that ended here would tear the
    others out of their collectives, each then printing its own consequence (gloo's errors, the store's C++
    stack traces). False without the launcher's folder (torchrun started by hand): rank 0 prints the error."""
    folder = os.environ.get(HANDED_ENV)
    if not folder:
        return False
    try:
        hand_over(folder, rank, error.exit_code, str(error))
    except OSError:  # (a full disk, the likely cause of the error itself): printed by rank 0 as without it
        return False
    with StopSignals() as stop:  # the agent ending the group (another worker ended first) ends the wait too
        deadline = time.monotonic() + HAND_OVER_S
        while stop.signum is None and time.monotonic() < deadline:
            time.sleep(0.05)
    return True


def _destroy_process_group() -> None:
    """Tear the process group down while the interpreter is still whole, after success and after an error.
    Left to interpreter shutdown, gloo's worker threads can still hold tensors whose release needs the GIL,
    and the process dies with SIGABRT ("terminate called without an active exception"; pytorch PR 179291)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _exit(code: int) -> None:
    """End the worker without interpreter finalization, where native threads' destructors run. A worker
    that had destroyed its process group still died with SIGABRT once in CI while the run around it passed
    its steps, and the launcher then rightly reported a lost rank. A worker holds no atexit duty: every file
    it writes is written (atomic_write) and every thread it starts is stopped before main() returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    die_with_parent()  # a launcher (and its agent) killed by SIGKILL leaves no worker running
    try:
        rc = main()
    except BaseException:  # a bug: its traceback, then the same exit as Python's own
        traceback.print_exc()
        rc = 1
    _exit(rc)
