"""What the launch's agent records of its failed workers (`lcft.launch.agent.failures`): the exit code, or the
signal that killed each, named, and whether that signal is one a launch stops its workers with."""

from __future__ import annotations

import json
import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from lcft.launch import _killed
from lcft.launch.agent import failures

RESUME = "start it again with --resume auto"


def _failed(exitcodes: dict[int, int]) -> ChildFailedError:
    """torch's error for workers that ended so, keyed by global rank (no error files: killed, or exited by
    themselves without torch's record)."""
    return ChildFailedError("lcft.launch", {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code,
                                                                 error_file="<N/A>")
                                            for rank, code in exitcodes.items()})


def test_workers_killed_by_any_signal_are_named(tmp_path):
    """A worker killed by realtime signal 40 (in signal.valid_signals(), not in signal.Signals) is recorded as
    SIGRTMIN+6: recording it raised ValueError and the agent died with a traceback. The launcher names it."""
    error = _failed({3: -40, 0: -int(signal.SIGKILL), 1: -int(signal.SIGTERM), 2: 1})
    recorded = failures(error)
    assert recorded == [
        {"rank": 0, "pid": 1000, "exitcode": -9, "signal": "SIGKILL", "stopped": False},
        {"rank": 1, "pid": 1001, "exitcode": -15, "signal": "SIGTERM", "stopped": True},
        {"rank": 2, "pid": 1002, "exitcode": 1, "signal": None, "stopped": False},
        {"rank": 3, "pid": 1003, "exitcode": -40, "signal": "SIGRTMIN+6", "stopped": False},
    ]
    path = tmp_path / "failures.json"
    path.write_text(json.dumps(recorded))
    assert _killed(path, 1, RESUME) == ("rank 0 on node 1 (pid 1000) was killed by SIGKILL, rank 3 on node 1 "
                                        f"(pid 1003) was killed by SIGRTMIN+6; {RESUME}")
