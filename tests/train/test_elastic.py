"""Faults from outside a `lcft train --nproc 2` run (gloo, 2 processes): a frozen worker ends the run within the
collective timeout naming its rank, SIGTERM with a frozen worker ends the job at once (one frozen after the
launcher passed the SIGTERM on too), and a rank SIGKILLed under --max-restarts is restarted with the group, which
continues from its latest checkpoint to the same losses and weights as an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

import psutil
import pytest
import torch

from lcft.train import latest_checkpoint
from tests.train.launching import (
    Ended,
    ending,
    error_lines,
    killed_on_failure,
    losses,
    rank_process,
    start_train,
    wait_for_step,
    weights,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@dataclass
class Frozen:
    """How a run ended after one of its ranks was frozen (SIGSTOP) once step 2 was logged."""
    ended: Ended
    took: float  # from the freeze (and the SIGTERM) to the launcher's exit
    frozen: psutil.Process


# (frozen rank, --collective-timeout, SIGTERM to the launcher at once).
FREEZES = [(0, 5, False), (1, 5, False), (1, 300, True)]


@pytest.fixture(scope="module")
def frozen_runs(tmp_path_factory, data_dir, init_dir) -> dict[tuple[int, bool], Frozen]:
    """For each of FREEZES, a `--nproc 2` run whose rank was frozen after step 2, by (rank, SIGTERM sent). Each run
    starts once the one before it froze its rank, so that its start overlaps their waits."""
    waiting = []
    with killed_on_failure() as started:
        for rank, timeout, sigterm in FREEZES:
            run = tmp_path_factory.mktemp("frozen") / "run"
            proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 0,
                               "--collective-timeout", timeout)
            started.append(proc)
            wait_for_step(run, 2, [proc])
            frozen = rank_process(proc, rank)
            frozen.suspend()
            while frozen.status() != psutil.STATUS_STOPPED:  # (SIGSTOP lands when the rank is next scheduled)
                time.sleep(0.01)
            if sigterm:  # frozen before the launcher tells it (the test below freezes a rank after)
                proc.terminate()
            waiting.append(((rank, sigterm), time.monotonic(), frozen, ending(proc, timeout=120)))
        outcomes = {key: ended() for key, _, _, ended in waiting}
    return {key: Frozen(outcomes[key], outcomes[key].at - t0, frozen) for key, t0, frozen, _ in waiting}


@pytest.mark.parametrize("rank", [1, 0])
def test_a_frozen_worker_ends_the_run_naming_its_rank(frozen_runs, rank):
    """SIGSTOP to one rank after step 2: the other's collective times out (5 s), the run exits 75 naming the
    frozen rank, and no process is left behind (the frozen one too). The run's store is the agent's (one node),
    which still answers with the frozen rank's beat standing still."""
    run = frozen_runs[rank, False]
    err, frozen = run.ended.err, run.frozen
    assert run.ended.code == 75, err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and f"rank {rank} on node 0 (host " in errors[0], err[-3000:]
    assert f"pid {frozen.pid})" in errors[0] and "stopped answering" in errors[0] and "--resume auto" in errors[0]
    assert "node 0 lost" not in errors[0]  # rank 1 - rank on node 0 still answers
    # The timeout, the diagnosis (3 beats; up to 10 s more for a silent store) and the launcher's 3 s grace.
    assert run.took < 5 + 3 + 10 + 3 + 15, run.took
    assert not frozen.is_running() or frozen.status() == "zombie"


def test_sigterm_with_a_frozen_worker_ends_the_job(frozen_runs):
    """A frozen rank can never take part in the final checkpoint: SIGTERM to the launcher ends the job at once
    (well within the 300 s collective timeout), exit 75, naming the frozen rank."""
    run = frozen_runs[1, True]
    err = run.ended.err
    assert run.ended.code == 75, err[-3000:]
    assert run.took < 30
    errors = error_lines(err)
    assert len(errors) == 1 and f"rank 1 on node 0 (pid {run.frozen.pid}) is stopped" in errors[0], err
    assert "SIGTERM" in errors[0]


# Put first on the workers' PYTHONPATH: rank 1 freezes itself (SIGSTOP) as soon as its stop handler has taken the
# launcher's SIGTERM up, so it is frozen only after the launcher told it, and rank 0 waits for it in the next step's
# collective.
FREEZE_RANK1_ONCE_TOLD = """
import os, signal
if os.environ.get("RANK") == "1":
    from lcft import signals
    _handle = signals.StopSignals._handle
    def handle(self, signum, frame):
        _handle(self, signum, frame)
        os.kill(os.getpid(), signal.SIGSTOP)
    signals.StopSignals._handle = handle
"""


def test_a_worker_frozen_after_it_was_told_to_stop_ends_the_job(tmp_path, data_dir, init_dir):
    """SIGTERM to the launcher while both ranks train; rank 1 freezes right after it took the forwarded SIGTERM up.
    The launcher finds it stopped among the workers it already told and ends the job at once, exit 75, naming it
    (it used to look only at workers not yet told: rank 0 waited for rank 1 until the 300 s collective timeout)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FREEZE_RANK1_ONCE_TOLD)
    path = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    run = tmp_path / "run"
    with killed_on_failure() as started:
        proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 0,
                           "--collective-timeout", 300, env={"PYTHONPATH": path})
        started.append(proc)
        wait_for_step(run, 2, [proc])
        frozen = rank_process(proc, 1)
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launch still ran 90 s after SIGTERM with rank 1 (pid {frozen.pid}) frozen once told: "
                        f"the launcher did not see it stopped (status {frozen.status()})")
    assert proc.returncode == 75, err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and f"rank 1 on node 0 (pid {frozen.pid}) is stopped" in errors[0], err[-3000:]
    assert "ended on SIGTERM" in errors[0] and "--resume auto" in errors[0], errors
    assert not frozen.is_running() or frozen.status() == "zombie"


def test_a_killed_rank_is_restarted_and_the_run_continues_exactly(tmp_path, data_dir, init_dir, one_process_run):
    """--max-restarts 1: rank 1 SIGKILLed once step 3 is logged; the agent restarts both ranks, they resume
    from the latest checkpoint by themselves, and the run ends (exit 0) with the losses and weights of the same
    run uninterrupted in one process (which two processes of one micro-batch each compute exactly; fp32, 1e-6).
    The restart is said naming the signal, as the run's error names it without restarts (it said that rank 1
    'stopped answering after a collective failed', rank 0's view of it)."""
    straight = one_process_run
    run = tmp_path / "elastic"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 6, "--save-every", 2, "--max-restarts", 1)
    wait_for_step(run, 3, [proc])
    victim = rank_process(proc, 1)
    victim.kill()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "resumed from" in err
    restarts = [line for line in err.splitlines() if line.startswith("restarting:")]
    assert restarts == [f"restarting: rank 1 on node 0 (pid {victim.pid}) was killed by SIGKILL"], err[-3000:]
    torch.testing.assert_close(losses(run), losses(straight), rtol=1e-6, atol=1e-6)
    a, b = weights(latest_checkpoint(run)), weights(latest_checkpoint(straight))
    assert latest_checkpoint(run).name == "step-00000006"
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-6)


# A restarted group's workers slow to start (1 s before the worker entry runs): a stop passed on to them then would
# end them.
SLOW_RESTART = ("import os, time\n"
                "if int(os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0) > 0 and 'RANK' in os.environ:\n"
                "    time.sleep(1)\n")


def test_a_stop_signal_during_a_restart_saves_and_spends_no_restart(tmp_path, data_dir, init_dir):
    """--max-restarts 3: rank 1 SIGKILLed after step 3, SIGTERM to the launcher once the agent started the
    restarted group: its ranks take the stop up once their handler is set, resume, save one step later and exit
    143. The new workers died of the SIGTERM passed on as they started, the agent restarted the group until its
    restarts were spent (waiting 30 s for a rank that had noted it), and nothing new was saved (63 s)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_RESTART)
    path = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 40, "--save-every", 2, "--max-restarts", 3,
                       env={"PYTHONPATH": path})
    wait_for_step(run, 3, [proc])
    (agent,) = psutil.Process(proc.pid).children()
    first = {w.pid for w in agent.children()}
    rank_process(proc, 1).kill()
    deadline = time.monotonic() + 120
    while not {w.pid for w in agent.children()} - first and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert "failed (exitcode: -15)" not in err, err[-3000:]
    resumed = int(re.search(r"resumed from \S+ \(step (\d+),", err).group(1))
    assert latest_checkpoint(run).name == f"step-{resumed + 1:08d}", err[-3000:]
    assert time.monotonic() - t0 < 30, err[-3000:]


def test_a_second_signal_ends_the_workers_at_once(tmp_path, data_dir, init_dir):
    """SIGINT then SIGTERM to the launcher (two kinds: the kernel merges a repeated pending signal, and delivers
    pending ones lowest number first): the first is passed on (finish the step, save), the second ends every
    worker at once; the command exits 143 (128 + SIGTERM) saying so, and no worker is left."""
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 0)
    wait_for_step(run, 2, [proc])
    workers = [rank_process(proc, r) for r in (0, 1)]
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "second SIGTERM: ending the workers now, before they saved" in err
    errors = error_lines(err)
    assert len(errors) == 1 and "stopped by a second SIGTERM before the workers saved" in errors[0], err[-3000:]
    assert not any(w.is_running() and w.status() != "zombie" for w in workers)


def _agent_started(proc) -> bool:
    return bool(psutil.Process(proc.pid).children())


@pytest.mark.parametrize("moment", ["before the workers exist", "as the workers start"])
def test_a_signal_while_the_workers_start_stops_the_run(tmp_path, data_dir, init_dir, moment):
    """SIGTERM to the launcher once its agent runs, before any worker exists, was passed to nobody: the run
    trained to its end and exited 0. A moment later, workers still starting died of it and the run exited 1,
    'processes failed'. Now every worker gets it, those started later too, and takes it up once it can (a step,
    then a checkpoint), or the launch says it stopped them before they saved: exit 143 either way."""
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--nproc", 2, "--steps", 100000, "--save-every", 0)
    deadline = time.monotonic() + 60
    while not _agent_started(proc) and time.monotonic() < deadline:
        time.sleep(0.01)
    if moment == "as the workers start":
        while time.monotonic() < deadline and not any(
                "lcft.launch" in " ".join(p.cmdline()) and p.ppid() != proc.pid
                for p in psutil.Process(proc.pid).children(recursive=True)):
            time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    errors = error_lines(err)
    saved = latest_checkpoint(run) if (run / "checkpoints").is_dir() else None
    assert saved is not None or (len(errors) == 1 and "stopped by SIGTERM while the workers were starting, "
                                 "before they saved" in errors[0]), err[-3000:]
