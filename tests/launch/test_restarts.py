"""How a launch of several nodes reads the way torchrun's agent ended, with a stand-in agent (a few lines of Python)
in its place: under --max-restarts, 'restarting: ...' is said only when the agent started new workers, and a lost
rank's diagnosis that no restart followed (the agent gave up) is the launch's error, exit 75; a rendezvous that
did not gather every node within the collective timeout is one line, exit 1 when the nodes never met (nothing to
requeue), 75 when a node did not come back for a restart; a stop signal while the nodes gather ends the launch at
once."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import lcft.launch as launcher
from lcft.errors import LcftError
from lcft.launch.process import EXIT_NOT_GATHERED, FAILURES_ENV
from lcft.launch.supervisor import Supervisor
from lcft.liveness import EXIT_LOST, FAILURE_FILE_ENV, PeerLost
from lcft.signals import Stopped
from lcft.train import TrainConfig
from tests.train.conftest import data_dir  # noqa: F401 (fixture)

LOST = "rank 0 on node 0 (host h, pid 1) stopped answering (node 0 lost)"
RESUME = "the run ended without a new checkpoint: start it again with --resume auto"
REPORT = f"{LOST}; {RESUME}"  # a worker's diagnosis, ending in the job's resume

# Stands in for torchrun's agent under --max-restarts: its worker reports a lost rank (into the launcher's failure
# file), starts a process of its own (a DataLoader's, a compile worker) and ends; then the agent either restarts the
# group (a new worker) and ends as it does, or gives up with argv[1] as its exit code (1: its restarts spent,
# ChildFailedError; 3: the rendezvous did not gather every node).
AGENT = f"""
import os, subprocess, sys, time
report = ("import os, subprocess, time; time.sleep(0.5); "
          "open(os.environ[{FAILURE_FILE_ENV!r}], 'x').write({REPORT!r} + '\\\\n'); subprocess.run(['sleep', '1'])")
subprocess.run([sys.executable, "-c", report])
time.sleep(0.5)  # (torchrun stops the group and meets the other nodes again)
if sys.argv[1] == "restart":
    sys.exit(subprocess.run(["sleep", "1"]).returncode)
sys.exit(int(sys.argv[1]))
"""

# Stands in for an agent that never started a worker: the rendezvous did not gather every node.
NEVER_GATHERED = f"import sys, time; time.sleep(0.5); sys.exit({EXIT_NOT_GATHERED})"


def _supervise(tmp_path: Path, capsys, how: str, agent: str = AGENT) -> tuple[int, str, Path]:
    failure = tmp_path / "failure.txt"
    env = {**os.environ, FAILURE_FILE_ENV: str(failure), FAILURES_ENV: str(tmp_path / "failures.json")}
    supervisor = Supervisor([sys.executable, "-c", agent, how], env, failure, None, 1, elastic=True, resume=RESUME)
    return supervisor.run(), capsys.readouterr().err, failure


def test_restarting_is_said_when_the_agent_restarts_the_group(tmp_path, capsys):
    """The diagnosis, without its resume: the run goes on by itself (it said to start it again)."""
    rc, err, failure = _supervise(tmp_path, capsys, "restart")
    assert (rc, err) == (0, f"restarting: {LOST}\n")
    assert not failure.exists()  # cleared for the new round's diagnosis


# Stands in for the agent under --max-restarts whose worker was killed by SIGKILL (no other rank reported it): it
# records the failed group's workers (agent._record), then restarts the group.
KILLED = [{"rank": 1, "pid": 7, "exitcode": -9, "signal": "SIGKILL", "stopped": False}]
KILLED_AGENT = f"""
import json, os, subprocess, sys, time
subprocess.run(["sleep", "0.5"])
open(os.environ[{FAILURES_ENV!r}], "w").write({json.dumps(KILLED)!r})
time.sleep(0.5)
sys.exit(subprocess.run(["sleep", "1"]).returncode)
"""


def test_restarting_names_a_worker_killed_by_a_signal(tmp_path, capsys):
    """The agent recorded rank 1 killed by SIGKILL before it restarted the group: the restart says so, as the
    launch's error says it without restarts (nothing was said), and the record is cleared for the new round's."""
    rc, err, _ = _supervise(tmp_path, capsys, "", KILLED_AGENT)
    assert (rc, err) == (0, "restarting: rank 1 on node 0 (pid 7) was killed by SIGKILL\n")
    assert not (tmp_path / "failures.json").exists()


@pytest.mark.parametrize("rc", [1, EXIT_NOT_GATHERED])
def test_restarting_is_not_said_when_the_agent_gives_up(tmp_path, capsys, rc):
    """Its restarts spent, or the other nodes not back: the node said 'restarting: ...' and then ended (and the
    diagnosis, cleared, was no longer the launch's error), and did so when the worker started a process of its own
    (new, but no restarted worker)."""
    got, err, failure = _supervise(tmp_path, capsys, str(rc))
    assert (got, err) == (rc, "")
    assert failure.read_text() == REPORT + "\n"  # what the launch raises


def _launch(tmp_path: Path, monkeypatch, data: Path, script: str, *args: str) -> LcftError:
    """`lcft train --nproc 1 --nnodes 2 --node-rank 1 --max-restarts 1` with `script` as its agent: the error the
    launch raises."""
    def stand_in(_cmd: list[str], env: dict[str, str], *rest, **kwargs) -> Supervisor:
        return Supervisor([sys.executable, "-c", script, *args], env, *rest, **kwargs)

    monkeypatch.setattr(launcher, "Supervisor", stand_in)
    cfg = TrainConfig(data=str(data), out=str(tmp_path / "run"), nproc=1, nnodes=2, node_rank=1,
                      rdzv_endpoint="127.0.0.1:29400", max_restarts=1, collective_timeout=4.5)
    with pytest.raises(LcftError) as raised:
        launcher.run("train", cfg)
    return raised.value



def test_a_lost_rank_that_no_restart_followed_is_exit_75(tmp_path, monkeypatch, capsys, data_dir):  # noqa: F811
    """The agent gave up (its restarts spent) after a worker named the lost rank: that diagnosis, exit 75. It was
    'training processes failed (torchrun exit code 1)', exit 1 (do not requeue), after 'restarting: ...'."""
    error = _launch(tmp_path, monkeypatch, data_dir, AGENT, "1")
    assert (type(error), str(error), error.exit_code) == (PeerLost, REPORT, EXIT_LOST)
    assert capsys.readouterr().err == ""


def test_a_rendezvous_that_never_gathered_the_nodes_is_a_user_error(tmp_path, monkeypatch, data_dir):  # noqa: F811
    error = _launch(tmp_path, monkeypatch, data_dir, NEVER_GATHERED)
    assert (type(error), error.exit_code) == (LcftError, 1)
    assert str(error) == ("the run's rendezvous at 127.0.0.1:29400 did not gather its 2 nodes within 5 s "
                          "(--collective-timeout; node 1 waited): start every node, with the same --nnodes, "
                          "--rdzv-endpoint and --out (its rendezvous is named after it)")


def test_a_node_that_does_not_come_back_for_a_restart_is_exit_75(tmp_path, monkeypatch, data_dir):  # noqa: F811
    error = _launch(tmp_path, monkeypatch, data_dir, AGENT, str(EXIT_NOT_GATHERED))
    assert (type(error), error.exit_code) == (PeerLost, EXIT_LOST)
    assert str(error) == ("the run's rendezvous at 127.0.0.1:29400 did not gather its 2 nodes again within 5 s for "
                          f"a restart: a node is gone; node 1's workers have no group to rejoin; {RESUME}")


# Stands in for an agent waiting at the rendezvous for the other nodes (argv[1]: a file saying it runs): it would
# wait the join timeout (--collective-timeout), then end as one that did not gather them.
WAITING = f"import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(4.5); sys.exit({EXIT_NOT_GATHERED})"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_the_nodes_gather_stops_at_once(tmp_path, monkeypatch, data_dir, signum):  # noqa: F811
    """Ctrl-C (or a scheduler's SIGTERM) while node 1 waits for the others: the launch ends at once, 128 + N, in one
    line. The signal was only noted (no worker to pass it on to), the agent waited out its join timeout, and the
    launch said the rendezvous did not gather its nodes: start every node, exit 1."""
    waiting = tmp_path / "waiting"

    def ctrl_c() -> None:
        while not waiting.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=ctrl_c)
    sender.start()
    t0 = time.monotonic()
    error = _launch(tmp_path, monkeypatch, data_dir, WAITING, str(waiting))
    sender.join()
    assert (type(error), error.exit_code) == (Stopped, 128 + signum)
    assert str(error) == f"stopped by {signum.name} before the nodes gathered (no worker had started); {RESUME}"
    assert time.monotonic() - t0 < 3
