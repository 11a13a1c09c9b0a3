"""What the launch's agent records of its failed workers (`lcft.launch.agent.failures`): the exit code, or the
signal that killed each, named, and whether that signal is one a launch stops its workers with; and which of
torch's log lines it leaves out (those that repeat the launcher's line) and which it prints."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import lcft.launch.agent as agent
from lcft.launch.agent import failures
from lcft.launch.process import FAILURES_ENV, killed_workers
from lcft.signals import GROUP_ENDING_ENV
from tests.train.launching import LAUNCH_NAMES, torch_logs

RESUME = "start it again with --resume auto"


def _failed(exitcodes: dict[int, int], pids: dict[int, int] | None = None) -> ChildFailedError:
    """torch's error for workers that ended so, keyed by global rank (no error files: killed, or exited by
    themselves without torch's record); `pids` by rank (default: 1000 + rank)."""
    return ChildFailedError("lcft.launch", {rank: ProcessFailure(local_rank=rank, pid=(pids or {}).get(rank, 1000 + rank),
                                                                 exitcode=code, error_file="<N/A>")
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
    assert killed_workers(path, 1, RESUME) == ("rank 0 on node 1 (pid 1000) was killed by SIGKILL, rank 3 on node 1 "
                                        f"(pid 1003) was killed by SIGRTMIN+6; {RESUME}")


def _agent(restarts: int, *worker: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The launch's agent on this machine, 2 workers running `worker` (a command, not Python), stderr captured."""
    return subprocess.Popen([sys.executable, "-m", "lcft.launch.agent", "--standalone", "--nproc-per-node=2",
                             f"--max-restarts={restarts}", "--no-python", *worker], stderr=subprocess.PIPE, text=True,
                            env={**{k: v for k, v in os.environ.items() if k != "LOGLEVEL"}, "OMP_NUM_THREADS": "1",
                                 **(env or {})})


def test_the_agent_logs_no_worker_failure_the_launcher_names():
    """Workers exit 3: without restarts the agent ends on it (the launcher names the failure). torch's 'failed
    (exitcode: N) local_rank ...' was printed."""
    agent = _agent(0, "sh", "-c", "exit 3")
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 1 and err == "", err


def test_the_agent_stopped_by_sigterm_logs_nothing():
    """SIGTERM to the agent (a scheduler's, to every process): exit 143, which the launcher names. torch logged
    'Received 15 death signal, shutting down workers' and 'Sending process N closing signal SIGTERM' per worker."""
    agent = _agent(0, "sleep", "60")
    deadline = time.monotonic() + 60
    while len(psutil.Process(agent.pid).children()) < 2 and time.monotonic() < deadline:  # its workers started
        time.sleep(0.1)
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 143 and err == "", err


# Under --max-restarts 2, workers that exit 75 in the first round (each named a lost rank itself) and are killed by
# SIGKILL in the next two.
EXIT_75_THEN_KILLED = ("import os, sys; os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and sys.exit(75); "
                       "os.kill(os.getpid(), 9)")


def test_what_the_launcher_does_not_say_stays_on_the_screen():
    """Under --max-restarts 2, the restart after workers exited 75 (they named the lost rank: no line), then a
    worker killed by a signal (the launcher says nothing of a restart's cause that no worker diagnosed): torch's
    line for that restart only, not for the failure the agent then ends on (its restarts spent: the launcher's
    error names it; it was printed above it), and nothing else; and every line with torch's LOGLEVEL set."""
    agent = _agent(2, sys.executable, "-c", EXIT_75_THEN_KILLED)
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 1 and len(torch_logs(err)) == 1 and err.splitlines() == torch_logs(err), err
    assert "failed (exitcode: -9)" in torch_logs(err)[0], err
    agent = _agent(0, "sh", "-c", "exit 3", env={"LOGLEVEL": "WARNING"})
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 1 and any("failed (exitcode: 3)" in line for line in torch_logs(err)), err


@pytest.mark.parametrize(("kind", "shown"), [("RendezvousConnectionError", False), ("RendezvousStateError", True)])
def test_a_rendezvous_host_gone_is_left_out_and_other_rendezvous_errors_shown(kind, shown):
    """torch's keep-alive and shutdown warnings (formatted before logging, as torch 2.13 words them) when the
    store of node 0's agent is gone (the launcher names node 0 or the rendezvous lost), and of any other kind."""
    from lcft.launch.agent import _RepeatedEnds

    quiet = _RepeatedEnds(restarts=0)
    for what in ("send a keep-alive heartbeat to the", "shutdown the"):
        msg = f"The node 'host_1_0' has failed to {what} rendezvous 'lcft-0' due to an error of type {kind}."
        assert quiet.filter(logging.makeLogRecord({"msg": msg, "args": ()})) is shown


# A worker of torchrun's agent (`WORKER DIR`) that notes in DIR when it started (its parent's pid: the process that
# started it) and when it ended, and takes SIGTERM as a worker saving takes it: it goes on SAVE_S more seconds.
# In round 0 under FAIL, rank 0 fails once rank 1 runs: the agent stops rank 1 and restarts the group.
SAVE_S = 3
WORKER = f"""
import os, pathlib, signal, sys, time
out, rank, round = pathlib.Path(sys.argv[1]), os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
signal.signal(signal.SIGTERM, lambda *_: (out / f"{{round}}-{{rank}}-termed").touch())
(out / f"{{round}}-{{rank}}-started").write_text(str(os.getppid()))
if round == "0" and os.environ.get("FAIL"):
    while not (out / "0-1-started").exists():
        time.sleep(0.05)
    if rank == "0":
        sys.exit(1)
if round == "0":
    end = time.monotonic() + 60
    while not (out / f"0-{{rank}}-termed").exists() and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep({SAVE_S})  # saving
(out / f"{{round}}-{{rank}}-ended").touch()
"""


def _saving_agent(tmp_path: Path, *, fail: bool) -> subprocess.Popen:
    """The launch's agent (lcft.launch.agent, the real torchrun) on two WORKERs, --max-restarts 1, grace 1 s."""
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_NAMES and k != "FAIL"}
    return subprocess.Popen([sys.executable, "-m", "lcft.launch.agent", "--standalone", "--nproc-per-node=2",
                             "--max-restarts=1", "--shutdown-timeout=1", str(tmp_path / "worker.py"), str(tmp_path)],
                            env={**env, **({"FAIL": "1"} if fail else {})}, stderr=subprocess.PIPE, text=True)


def test_the_grace_ends_the_run_on_a_signal_but_not_the_restart_of_a_group(tmp_path):
    """--shutdown-timeout 1 (the launch's --stop-grace) is how long the agent waits for its workers after it passed
    on a signal; the close before a restart keeps torch's 30 s, so a worker still saving when another failed
    finishes (on torch 2.11, which has no such flag, the agent's shim gave every close the grace: it was SIGKILLed
    after 1 s). The workers are the agent's own children (the launcher tells a restart by new ones)."""
    agent = _saving_agent(tmp_path, fail=True)
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err[-3000:]
    assert (tmp_path / "0-1-termed").exists() and (tmp_path / "0-1-ended").exists(), err[-3000:]
    assert {(tmp_path / f"{r}-{k}-started").read_text() for r in (0, 1) for k in (0, 1)} == {str(agent.pid)}

    signalled = tmp_path / "signalled"
    signalled.mkdir()
    agent = _saving_agent(signalled, fail=False)
    deadline = time.monotonic() + 60
    while not all((signalled / f"0-{k}-started").exists() for k in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert (signalled / "0-0-termed").exists() and not (signalled / "0-0-ended").exists(), err[-3000:]
    assert time.monotonic() - t0 < SAVE_S + 1


# In round 0, rank 0 takes no SIGTERM (still busy past the close's grace: a save on a stalled disk) and rank 1 is
# killed by SIGKILL once rank 0 runs; round 1 ends at once.
BUSY_THEN_KILLED = """
import os, pathlib, signal, sys, time
out, rank = pathlib.Path(sys.argv[1]), os.environ["RANK"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if rank == "0":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (out / "busy").touch()
        time.sleep(120)
    while not (out / "busy").exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""

# Put first on the agent's PYTHONPATH: the close of a failed group waits 2 s for its workers, not torch's 30 s.
SHORT_CLOSE = """
import os
if "RANK" not in os.environ:
    from torch.distributed.elastic.multiprocessing.api import PContext
    PContext.close.__defaults__ = (None, 2)
"""


def test_a_worker_the_agent_kills_when_its_grace_runs_out_is_no_cause(tmp_path):
    """Rank 1 killed by SIGKILL; rank 0, still busy, outlasts the grace of the agent's close and is SIGKILLed by
    the agent. The restart names rank 1 alone: it named rank 0 too, 'killed by SIGKILL' as if something outside had
    killed it (a loaded machine's full suite once, the ranks of a long step on every failure)."""
    (tmp_path / "worker.py").write_text(BUSY_THEN_KILLED)
    (tmp_path / "sitecustomize.py").write_text(SHORT_CLOSE)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_NAMES}
    path = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    recorded = tmp_path / "failures.json"
    agent = subprocess.Popen([sys.executable, "-m", "lcft.launch.agent", "--standalone", "--nproc-per-node=2",
                              "--max-restarts=1", str(tmp_path / "worker.py"), str(tmp_path)],
                             env={**env, "PYTHONPATH": path, FAILURES_ENV: str(recorded),
                                  GROUP_ENDING_ENV: str(tmp_path / "ending")}, stderr=subprocess.PIPE, text=True)
    _, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err[-3000:]
    assert "Unable to shutdown process" in err, err[-3000:]  # (torch's word that it SIGKILLed rank 0)
    by_rank = {f["rank"]: (f["signal"], f["stopped"]) for f in json.loads(recorded.read_text())}
    assert by_rank == {0: ("SIGKILL", True), 1: ("SIGKILL", False)}, by_rank
    assert killed_workers(recorded, 0, RESUME).startswith("rank 1 on node 0 (pid "), recorded.read_text()


def _group(*pids: tuple[int, int | None]) -> SimpleNamespace:
    """A group's process context as the agent's close sees it: (pid, its exit code; None while it runs) each."""
    handlers = {rank: SimpleNamespace(proc=SimpleNamespace(pid=pid, poll=lambda code=code: code))
                for rank, (pid, code) in enumerate(pids)}
    return SimpleNamespace(subprocess_handlers=handlers, pids=lambda: {r: h.proc.pid for r, h in handlers.items()})


def test_a_worker_of_a_later_group_with_an_ended_workers_pid_is_a_cause(tmp_path, monkeypatch):
    """The agent ends group 0 while its pid 100 runs; group 1's worker reuses pid 100 and is killed by SIGKILL (the
    OOM killer) before the close: it is the cause, not a worker the agent ended (was: 'stopped', and the restart
    named no cause at all)."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    monkeypatch.setattr(PContext, "close", lambda self, *args, **kwargs: None)  # (undone: the agent's wrap too)
    monkeypatch.setattr(agent, "_ended", set())
    monkeypatch.setenv(GROUP_ENDING_ENV, str(tmp_path / "ending"))
    agent._name_ended_groups()
    PContext.close(_group((100, None), (101, None)))  # group 0: a failure elsewhere, both still running
    assert failures(_failed({0: -9}, pids={0: 100}))[0]["stopped"]  # (ended by the agent, SIGKILLed in its close)
    PContext.close(_group((100, -9), (102, None)))  # group 1: pid 100 again, killed first; 102 ended with it
    recorded = failures(_failed({0: -9, 1: -9}, pids={0: 100, 1: 102}))
    assert [(f["pid"], f["stopped"]) for f in recorded] == [(100, False), (102, True)], recorded


def test_a_worker_killed_by_another_signal_while_its_group_is_closed_is_a_cause(tmp_path, monkeypatch):
    """Rank 0 killed by SIGKILL; rank 1, still running when the agent closes the group, is killed meanwhile by a
    signal that is not the agent's (SIGRTMIN+6: the agent kills with SIGKILL): both are causes (was: rank 1
    'stopped', unnamed, when the agent saw rank 0 dead before rank 1 in a kill of both)."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    monkeypatch.setattr(PContext, "close", lambda self, *args, **kwargs: None)  # (undone: the agent's wrap too)
    monkeypatch.setattr(agent, "_ended", set())
    monkeypatch.setenv(GROUP_ENDING_ENV, str(tmp_path / "ending"))
    agent._name_ended_groups()
    PContext.close(_group((100, -9), (101, None), (102, None)))
    recorded = failures(_failed({0: -9, 1: -40, 2: -15}, pids={0: 100, 1: 101, 2: 102}))
    assert [(f["pid"], f["signal"], f["stopped"]) for f in recorded] == [
        (100, "SIGKILL", False), (101, "SIGRTMIN+6", False), (102, "SIGTERM", True)], recorded


def test_each_group_is_handed_the_round_torch_prefixes_its_rendezvous_store_with(monkeypatch):
    """Two groups formed in turn by one node's c10d rendezvous handler: after each, the agent's environment (its
    workers' to be) holds the round that torch names that group's store keys with (torch.rendezvous.RUN.ROUND),
    read back from the raw store: 0, then 1."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from lcft.launch.agent import SHARE_OFF_ENV, _hand_round
    from lcft.liveness import ROUND_ENV

    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", DynamicRendezvousHandler.next_rendezvous)
    for name in (ROUND_ENV, SHARE_OFF_ENV):  # (both set by the agent: gone again after the test)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    _hand_round(across=True)
    handler = get_rendezvous_handler(RendezvousParameters("c10d", "127.0.0.1:0", "t", 1, 1, is_host=True))
    try:
        for group in (0, 1):
            info = handler.next_rendezvous()
            info.store.set("mark", str(group))
            raw = handler._store  # (the backend's store, unprefixed)
            assert raw.get(f"torch.rendezvous.t.{os.environ[ROUND_ENV]}/mark") == str(group).encode()
            assert os.environ[ROUND_ENV] == str(group) and SHARE_OFF_ENV not in os.environ
    finally:
        handler.shutdown()


def test_a_node_replacing_the_one_that_served_the_store_gives_every_node_one_address(monkeypatch):
    """Nodes A and B form a group (A ranked 0 serves the workers' store); A dies, and C, which the rendezvous ranks
    before B, joins B in the next round: both are given the store C now serves. B was given the address of the
    dead one's (torch keeps the first group's)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from lcft.launch.agent import SHARE_OFF_ENV, _hand_round
    from lcft.liveness import ROUND_ENV

    monkeypatch.setattr(dr.DynamicRendezvousHandler, "next_rendezvous", dr.DynamicRendezvousHandler.next_rendezvous)
    for name in (ROUND_ENV, SHARE_OFF_ENV):  # (both set by the agent: gone again after the test)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    _hand_round(across=True)
    backend = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True)  # (node 0's rendezvous, which outlives A)
    params = RendezvousParameters("c10d", f"127.0.0.1:{backend.port}", "t", 2, 2, is_host=False, join_timeout=30,
                                  last_call_timeout=1, keep_alive_interval=1, keep_alive_max_attempt=2)
    a, b = get_rendezvous_handler(params), get_rendezvous_handler(params)
    first = _together([a, b])
    assert [i.rank for i in first] == [0, 1] and a._shared_tcp_store_server is not None
    a._stop_heartbeats()  # A dies: its heartbeats stop, and the store it served goes with it
    # (its server object is held to the end, so its port stays taken: one freed could be the next one bound at 0)
    held, a._shared_tcp_store_server = a._shared_tcp_store_server, None
    dead = held.port
    c = get_rendezvous_handler(params)
    c._this_node = c._op_executor._node = dr._NodeDesc(c._this_node.addr, c._this_node.pid, -1)  # (sorts first)
    try:
        then = _together([b, c])
        assert [i.rank for i in then] == [1, 0] and os.environ[ROUND_ENV] == "1"
        served = c._shared_tcp_store_server.port
        assert served != dead
        assert [(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in then] == [
            (c._this_node.addr, served)] * 2
    finally:
        for h in (b, c):
            h.shutdown()


def _together(handlers: list) -> list:
    """Each handler's next rendezvous, all at once (each node's agent joins from its own process)."""
    out: list = [None] * len(handlers)

    def join(i: int) -> None:
        try:
            out[i] = handlers[i].next_rendezvous()
        except Exception as e:  # (raised in the test's thread below)
            out[i] = e

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(handlers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for o in out:
        if isinstance(o, BaseException) or o is None:
            raise AssertionError(f"a rendezvous failed: {o!r}")
    return out
