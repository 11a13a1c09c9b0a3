"""Signals that reach torchrun's agent of a `lcft train --nproc 2` run, not only the launcher: SIGTERM to every
process of the job (a scheduler's scancel or preemption), SIGTERM to the agent alone, and SIGKILL to the agent
alone. One line or none on stderr, never a traceback, and the exit code a scheduler acts on."""

from __future__ import annotations

import json
import signal
import subprocess

import psutil
import pytest

from lcft.checkpoint.state import read_state
from lcft.train import latest_checkpoint
from lcft.train.metrics import read_metrics
from tests.train.launching import error_lines, start_train, wait_for_step

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _agent(launcher: subprocess.Popen) -> psutil.Process:
    """The launcher's one child: torchrun's agent (`python -m lcft.launch.agent`)."""
    (agent,) = psutil.Process(launcher.pid).children()
    assert "lcft.launch.agent" in agent.cmdline(), agent.cmdline()
    return agent


@pytest.mark.parametrize("whom", ["every process", "the agent alone"])
def test_sigterm_reaching_the_agent_saves_and_exits_143(tmp_path, data_dir, init_dir, whom):
    """SIGTERM to the launcher, the agent and both workers (as scancel sends it to the job's cgroup), or to the
    agent alone: the workers finish the step and save, and the command exits 143 with rank 0's line of what it
    saved. It printed the agent's SignalException traceback, then 'stopped by SIGTERM while the workers were
    starting, before they saved' (every process) or 'training processes failed', exit 1 (the agent alone)."""
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 0)
    wait_for_step(run, 3, [proc])
    agent = _agent(proc)
    targets = [psutil.Process(proc.pid), agent, *agent.children(recursive=True)] if whom == "every process" \
        else [agent]
    assert len(targets) == (4 if whom == "every process" else 1)
    for p in targets:
        p.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and error_lines(err) == [], err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == "signal" and summary["signal"] == "SIGTERM"
    step = read_state(latest_checkpoint(run)).step
    assert step == read_metrics(run)[-1]["step"] == summary["step"] >= 3
    assert f"stopped by SIGTERM at step {step}/100000" in out


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGKILL, "SIGKILL"), (40, "SIGRTMIN+6")])
def test_sigkill_to_the_agent_is_a_lost_launch(tmp_path, data_dir, init_dir, sig, name):
    """SIGKILL to the agent (the OOM killer, a scheduler), or a realtime signal it does not handle: its workers die
    with it, nothing is saved, and the command exits 75 (requeue, --resume auto) with one line naming the agent.
    It exited 1 with 'training processes failed (torchrun exit code -9); the first error is printed above', and
    nothing was above (signal 40, not in signal.Signals: so until it had a name)."""
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 2)
    wait_for_step(run, 3, [proc])
    agent = _agent(proc)
    workers = agent.children()
    agent.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert "Traceback" not in err
    assert error_lines(err) == [f"error: torchrun's agent on node 0 (pid {agent.pid}) was killed by {name}, and "
                                "its workers with it; the run ended without a new checkpoint: start it again with "
                                "--resume auto"], err[-3000:]
    assert len(workers) == 2 and not any(w.is_running() and w.status() != "zombie" for w in workers)
    assert read_state(latest_checkpoint(run)).step >= 2  # the earlier checkpoints stand for --resume auto
