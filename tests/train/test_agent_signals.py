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

import psutil
import pytest

from lcft.checkpoint.layout import verify_checkpoint
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


@pytest.mark.parametrize(("grace", "save_s"), [(2, 12), (60, 33)])
def test_the_agent_waits_stop_grace_for_the_final_save(tmp_path, data_dir, init_dir, grace, save_s):
    """SIGTERM to every process while rank 0's final checkpoint takes `save_s` s: with a --stop-grace longer than
    that (and than torch's own 30 s) the checkpoint is whole and the command exits 143 as after any stop; with a
    shorter one the agent kills the workers at the grace: no new checkpoint, exit 143, one line that names the grace.
    The agent killed them 30 s after its SIGTERM whatever the grace (there was none to give)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_SAVE.format(seconds=save_s))
    path = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 0,
                       "--stop-grace", grace, env={"PYTHONPATH": path})
    wait_for_step(run, 2, [proc])
    agent = _agent(proc)
    signalled = time.monotonic()
    for p in [psutil.Process(proc.pid), agent, *agent.children(recursive=True)]:
        p.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    took = time.monotonic() - signalled
    assert proc.returncode == 143, err[-3000:]
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
