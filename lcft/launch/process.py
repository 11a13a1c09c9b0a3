"""What the launcher, torchrun's agent and the workers share of a launch's processes: the files the launcher
names in their environment, and ending with the parent."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

ERRORS_ENV = "LCFT_USER_ERRORS"  # set by the launcher: the folder where a rank writes its user error (file: RANK)
FAILURES_ENV = "LCFT_WORKER_FAILURES"  # set by the launcher: where the agent writes the failed workers
_PR_SET_PDEATHSIG = 1  # prctl(2)
RESULT_FILE_ENV = "LCFT_RESULT_FILE"  # set by the launcher: where rank 0 hands back its summary
PARENT_ENV = "LCFT_PARENT_PID"  # set by the launcher (its pid) for the agent, and by the agent for the workers


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
