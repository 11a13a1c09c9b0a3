"""Signals that reach torchrun's agent of a `lcft train --nproc 2` run, not only the launcher: SIGTERM to every
process of the job (a scheduler's scancel or preemption), SIGTERM to the agent alone, and SIGKILL to the agent
alone. One line or none on stderr, never a traceback, and the exit code a scheduler acts on; a final save that
takes long is waited for --stop-grace seconds, no longer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from lcft.checkpoint.layout import verify_checkpoint
from lcft.checkpoint.state import read_state
from lcft.train import latest_checkpoint
from lcft.train.metrics import read_metrics
from tests.train.launching import Ended, ending, error_lines, killed_on_failure, start_train, wait_for_step

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _agent(launcher: subprocess.Popen) -> psutil.Process:
    """The launcher's one child: torchrun's agent (`python -m lcft.launch.agent`)."""
    (agent,) = psutil.Process(launcher.pid).children()
    assert "lcft.launch.agent" in agent.cmdline(), agent.cmdline()
    return agent


# Put first on the workers' PYTHONPATH: rank 0's checkpoint takes {seconds} s longer, inside the save, once its files
# are written (read back and hashed as on a slow file system). The other rank waits for it, as in any save.
SLOW_SAVE = """
import os, time
if os.environ.get("RANK") == "0":
    import lcft.checkpoint.save as save
    _checksums = save.write_checksums
    def write_checksums(folder):
        time.sleep({seconds})
        _checksums(folder)
    save.write_checksums = write_checksums
"""

# The runs this module stops by SIGTERM: to whom it goes, --stop-grace (None: the default), how many seconds
# longer rank 0's final save takes. A save longer than torch's own 30 s kill, within the grace; one longer
# than the grace; a plain save, the agent alone signalled.
SLOW = ("every process", 60, 33)
KILLED = ("every process", 2, 12)
AGENT = ("the agent alone", None, 0)


@dataclass
class Stopped:
    """One of the runs stopped by SIGTERM: its folder, and how and when it ended."""
    run: Path
    ended: Ended
    took: float  # from the SIGTERM to the launcher's exit


@dataclass
class AgentKilled:
    """A run whose agent alone got a signal it does not survive: its folder, the agent's pid and its workers (as
    they were when it was sent), and how the launcher ended."""
    run: Path
    agent: int
    workers: list[psutil.Process]
    ended: Ended


def _start(root: Path, data_dir: Path, init_dir: Path, started: list[subprocess.Popen], *args: object,
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen, psutil.Process]:
    """A `--nproc 2` run in `root`/run with `args`, once step 3 is logged: the launcher and its agent."""
    proc = start_train(data_dir, init_dir, root / "run", "--nproc", 2, "--steps", 100000, *args, env=env)
    started.append(proc)
    wait_for_step(root / "run", 3, [proc])
    return proc, _agent(proc)


@pytest.fixture(scope="module")
def launches(tmp_path_factory, data_dir, init_dir) -> tuple[dict[tuple[str, int | None, int], Stopped],
                                                            dict[int, AgentKilled]]:
    """Each of SLOW, KILLED and AGENT: a run stopped by SIGTERM once step 3 is logged; then a run whose agent gets
    SIGKILL, and one whose agent gets signal 40 (SIGRTMIN+6). Each starts once the one before it was signalled, so
    that its start and its stop overlap the final saves (the last two, SLOW's 33 s)."""
    waiting, killed = [], []
    with killed_on_failure() as started:
        for whom, grace, save_s in (SLOW, KILLED, AGENT):
            root = tmp_path_factory.mktemp("stopped")
            env = {"PYTHONPATH": _slow_save(root / "hook", save_s)} if save_s else None
            proc, agent = _start(root, data_dir, init_dir, started, "--save-every", 0,
                                 *(("--stop-grace", grace) if grace is not None else ()), env=env)
            targets = [psutil.Process(proc.pid), agent, *agent.children(recursive=True)] \
                if whom == "every process" else [agent]
            assert len(targets) == (4 if whom == "every process" else 1)
            signalled = time.monotonic()
            for p in targets:
                p.send_signal(signal.SIGTERM)
            waiting.append(((whom, grace, save_s), root / "run", signalled, ending(proc, timeout=300)))
        for sig in (signal.SIGKILL, 40):
            root = tmp_path_factory.mktemp("agent-killed")
            proc, agent = _start(root, data_dir, init_dir, started, "--save-every", 2)
            workers = agent.children()
            agent.send_signal(sig)
            killed.append((int(sig), root / "run", agent.pid, workers, ending(proc, timeout=120)))
        ends = [(key, run, t0, ended()) for key, run, t0, ended in waiting]
        kills = {sig: AgentKilled(run, pid, workers, ended()) for sig, run, pid, workers, ended in killed}
    return {key: Stopped(run, e, e.at - t0) for key, run, t0, e in ends}, kills


@pytest.fixture(scope="module")
def stopped(launches) -> dict[tuple[str, int | None, int], Stopped]:
    return launches[0]


def _slow_save(hook: Path, seconds: int) -> str:
    """A PYTHONPATH with SLOW_SAVE first, in folder `hook`."""
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_SAVE.format(seconds=seconds))
    return os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.mark.parametrize("stop", [SLOW, AGENT], ids=["every process", "the agent alone"])
def test_sigterm_reaching_the_agent_saves_and_exits_143(stopped, stop):
    """SIGTERM to the launcher, the agent and both workers (as scancel sends it to the job's cgroup; rank 0's
    final save takes 33 s, within --stop-grace 60), or to the agent alone: the workers finish the step and save,
    and the command exits 143 with rank 0's line of what it saved. It printed the agent's SignalException
    traceback, then 'stopped by SIGTERM while the workers were starting, before they saved' (every process) or
    'training processes failed', exit 1 (the agent alone)."""
    run, out, err = stopped[stop].run, stopped[stop].ended.out, stopped[stop].ended.err
    assert stopped[stop].ended.code == 143, err[-3000:]
    assert "Traceback" not in err and error_lines(err) == [], err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == "signal" and summary["signal"] == "SIGTERM"
    step = read_state(latest_checkpoint(run)).step
    assert step == read_metrics(run)[-1]["step"] == summary["step"] >= 3
    assert f"stopped by SIGTERM at step {step}/100000" in out


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGKILL, "SIGKILL"), (40, "SIGRTMIN+6")])
def test_sigkill_to_the_agent_is_a_lost_launch(launches, sig, name):
    """SIGKILL to the agent (the OOM killer, a scheduler), or a realtime signal it does not handle: its workers die
    with it, nothing is saved, and the command exits 75 (requeue, --resume auto) with one line naming the agent.
    It exited 1 with 'training processes failed (torchrun exit code -9); the first error is printed above', and
    nothing was above (signal 40, not in signal.Signals: so until it had a name)."""
    killed = launches[1][int(sig)]
    err = killed.ended.err
    assert killed.ended.code == 75, err[-3000:]
    assert "Traceback" not in err
    assert error_lines(err) == [f"error: torchrun's agent on node 0 (pid {killed.agent}) was killed by {name}, and "
                                "its workers with it; the run ended without a new checkpoint: start it again with "
                                "--resume auto"], err[-3000:]
    workers = killed.workers
    assert len(workers) == 2 and not any(w.is_running() and w.status() != "zombie" for w in workers)
    assert read_state(latest_checkpoint(killed.run)).step >= 2  # the earlier checkpoints stand for --resume auto


@pytest.mark.parametrize("stop", [KILLED, SLOW], ids=["2-12", "60-33"])
def test_the_agent_waits_stop_grace_for_the_final_save(stopped, stop):
    """SIGTERM to every process while rank 0's final checkpoint takes `save_s` s: with a --stop-grace longer than
    that (and than torch's own 30 s) the checkpoint is whole and the command exits 143 as after any stop; with a
    shorter one the agent kills the workers at the grace: no new checkpoint, exit 143, one line that names the grace.
    The agent killed them 30 s after its SIGTERM whatever the grace (there was none to give)."""
    _, grace, save_s = stop
    run, took, out, err = stopped[stop].run, stopped[stop].took, stopped[stop].ended.out, stopped[stop].ended.err
    assert stopped[stop].ended.code == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if save_s < grace:
        assert took > save_s and error_lines(err) == [], err[-3000:]
        step = json.loads((run / "summary.json").read_text())["step"]
        assert read_state(latest_checkpoint(run)).step == step and verify_checkpoint(latest_checkpoint(run))
        assert f"stopped by SIGTERM at step {step}/100000" in out
    else:
        assert took < save_s and latest_checkpoint(run) is None and not (run / "summary.json").exists()
        assert error_lines(err) == [
            "error: stopped by SIGTERM, which torchrun's agent got too and passed on, before the workers saved (the "
            f"agent kills them --stop-grace {grace} s after it); the run ended without a new checkpoint: start it "
            "again with --resume auto"], err[-3000:]
