"""The launcher from outside, as a scheduler and a second user see it: every check before the first byte
(`--cp 3 --nproc 2` is one line and leaves no folder), one launch per folder from the first byte (a second one
0.3 s or more after the first took its folder is refused naming the holder, and the first trains its own
config), ranks killed mid-step (SIGKILL, a realtime signal) or one killed inside a sharded save are exit 75
naming each, and a SIGKILLed launcher leaves no worker running (its temporary folder goes at the next launch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from lcft.checkpoint.layout import verify_checkpoint
from lcft.cli.app import app
from lcft.config import ConfigError
from lcft.errors import LcftError
from lcft.folder_lock import LOCK_NAME
from lcft.launch import run
from lcft.launch.temp_folder import launch_folder
from lcft.train import TrainConfig, train
from lcft.train.config import load_run_config
from tests.launch.in_group import train_cp3
from tests.parallel.harness import run_ranks
from tests.train.conftest import data_dir, init_dir  # noqa: F401 (fixtures)
from tests.train.launching import (
    LAUNCH_NAMES,
    MPI_SIZES,
    RUN,
    error_lines,
    rank_process,
    start_train,
    wait_for_step,
)


def test_a_world_that_does_not_split_is_one_line_and_leaves_nothing(tmp_path, data_dir, init_dir):  # noqa: F811
    out = tmp_path / "new" / "run"
    r = CliRunner().invoke(app, ["train", "--data", str(data_dir), "--init", str(init_dir), "--out", str(out),
                                 "--cp", "3", "--nproc", "2", *RUN])
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: world size 2 is not divisible by cp=3"), r.stderr
    assert not (tmp_path / "new").exists()
    with pytest.raises(ConfigError, match="not divisible by cp=3"):  # the library's one entry checks the same
        run("train", TrainConfig(data=str(data_dir), out=str(out), cp=3, nproc=2))
    assert not (tmp_path / "new").exists()


def _outside_any_launcher() -> dict[str, str]:
    """This environment without what a launcher sets (the tests may run under one)."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_NAMES}


@pytest.mark.parametrize("size", MPI_SIZES)
def test_nproc_started_several_times_by_mpirun_or_srun_is_one_line_and_leaves_nothing(tmp_path, data_dir,  # noqa: F811
                                                                                       init_dir, size):  # noqa: F811
    """`mpirun -n 4 lcft train --nproc 2` on one node: each copy would start its own launch into the one folder
    (the first training, the others refused by its lock as if another user held it); every copy is refused before
    its launcher starts, with the line a plain process gets."""
    out = tmp_path / "new" / "run"
    cmd = [sys.executable, "-m", "lcft", "train", "--data", str(data_dir), "--init", str(init_dir), "--out", str(out),
           "--nproc", "2", "--steps", "1", *RUN]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**_outside_any_launcher(), size: "4"})
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.count("\n") == 1 and error_lines(r.stderr) == [
        f"error: {size}=4 in the environment: this process is one of 4 that mpirun or srun started, and each would "
        "run the whole job alone into the same output folder; lcft starts its own processes: run the command once "
        "per node with --nproc N, or under torchrun"], r.stderr[-3000:]
    assert not (tmp_path / "new").exists()


def test_nproc_in_a_one_task_step_of_a_larger_allocation_is_launched(tmp_path, monkeypatch, data_dir):  # noqa: F811
    """`sbatch -n 4` then `srun -n 1 lcft train --nproc 2` (SLURM_NTASKS is the job's 4, SLURM_STEP_NUM_TASKS the
    step's 1), or the batch script itself running it: one copy, launched; so is a copy per node of --nnodes, but
    not more copies than nodes."""
    import lcft.launch as launcher

    for k in _outside_any_launcher().keys() ^ os.environ.keys():
        monkeypatch.delenv(k)
    started = []
    monkeypatch.setattr(launcher, "launch", lambda name, cfg, entry: started.append(cfg.nnodes) or {})
    monkeypatch.setenv("SLURM_NTASKS", "4")
    for step, nodes in ((None, 1), ("1", 1), ("2", 2)):
        if step is not None:
            monkeypatch.setenv("SLURM_STEP_NUM_TASKS", step)
        run("train", TrainConfig(data=str(data_dir), out=str(tmp_path / "run"), nproc=2, nnodes=nodes,
                                 rdzv_endpoint="h:1" if nodes > 1 else None))
    assert started == [1, 1, 2] and not (tmp_path / "run").exists()
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "8")  # `srun -N 2 -n 8`: 4 launchers a node, one rendezvous
    with pytest.raises(LcftError, match="SLURM_STEP_NUM_TASKS=8 in the environment: this process is one of 8"):
        run("train", TrainConfig(data=str(data_dir), out=str(tmp_path / "run"), nproc=2, nnodes=2,
                                 rdzv_endpoint="h:1"))
    assert started == [1, 1, 2]


def test_the_library_runs_in_the_process_it_is_called_in(tmp_path, data_dir):  # noqa: F811
    """train() never starts processes: several are lcft.launch.run's (or the CLI's) to start."""
    with pytest.raises(ValueError, match=r"lcft.launch.run\('train', cfg\)"):
        train(TrainConfig(data=str(data_dir), out=str(tmp_path / "run"), nproc=2))
    assert not (tmp_path / "run").exists()


@pytest.mark.distributed
def test_the_library_called_inside_a_process_group_checks_that_groups_world(tmp_path, data_dir):  # noqa: F811
    """lcft.launch.run inside 2 gloo processes someone else made (no torchrun agent): the world is the group's 2,
    so --cp 3 is refused before anything is written, naming 2 processes (not a one-process world)."""
    out = tmp_path / "run"
    for result in run_ranks(train_cp3, 2, str(data_dir), str(out)):
        assert result is not None and result[0] == "ConfigError", result
        assert "world size 2 is not divisible by cp=3" in result[1], result
    assert not out.exists()


def _holding(first: subprocess.Popen, out: Path, timeout: float = 120) -> None:
    """Until the first launch holds `out` (its pid in the lock file): from then on it is the one writer."""
    deadline = time.monotonic() + timeout
    while not ((out / LOCK_NAME).is_file() and (out / LOCK_NAME).read_text().startswith(f"{first.pid} ")):
        assert first.poll() is None and time.monotonic() < deadline, "the first launch never took its folder"
        time.sleep(0.02)


def _second_launches(cmd: list[str], delays: tuple[float, ...]) -> list[subprocess.CompletedProcess]:
    """`lcft CMD` started `delays` seconds from now (each while the others start), once each has ended."""
    t0, procs = time.monotonic(), []
    for delay in delays:
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        procs.append(subprocess.Popen([sys.executable, "-m", "lcft", *cmd], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    ended = [(p, *p.communicate(timeout=300)) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, out, err in ended]


def _refused(second: subprocess.CompletedProcess, command: str, out, pid: int) -> None:
    assert second.returncode == 1, second.stderr[-3000:]
    assert error_lines(second.stderr) == [f"error: another `{command}` is writing into {out} (pid {pid}); wait for "
                                          "it to finish or choose another output folder"], second.stderr[-3000:]


def _with(args: list[str], option: str, value: str) -> list[str]:
    """`args` with `option`'s value replaced (an option of one value is refused when given twice)."""
    at = args.index(option) + 1
    return [*args[:at], value, *args[at + 1:]]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_second_train_launch_is_refused_and_the_first_trains_its_own_config(tmp_path, data_dir, init_dir):  # noqa: F811
    """Second launches 0.3, 1 and 3 s after the first took its folder (long before its rank 0 starts), with
    another learning rate: each is refused naming the first's pid, and the first run trains (and records) its
    own learning rate, then stops on SIGTERM."""
    out = tmp_path / "run"
    first = start_train(data_dir, init_dir, out, "--nproc", 2, "--steps", 100000, "--save-every", 0)
    _holding(first, out)
    for second in _second_launches(["train", "--data", str(data_dir), "--init", str(init_dir), "--out", str(out),
                                    "--nproc", "2", "--steps", "3", *_with(RUN, "--lr", "5e-4")], (0.3, 1.0, 3.0)):
        _refused(second, "lcft train", out, first.pid)
    wait_for_step(out, 2, [first])
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 143, err[-3000:]
    assert load_run_config(out / "config.toml").lr == 1e-3
    assert json.loads((out / "summary.json").read_text())["stopped"] == "signal"
    assert not (out / ".lcft.lock").exists()


@pytest.mark.distributed
@pytest.mark.slow
def test_a_second_eval_launch_is_refused_and_the_first_reports_its_own_checkpoint(tmp_path, data_dir, init_dir):  # noqa: F811
    out = tmp_path / "report"
    cmd = ["eval", "--data", str(data_dir), "--checkpoint", str(init_dir), "--max-windows", "2", "--out", str(out),
           "--nproc", "2", "--quiet"]
    first = subprocess.Popen([sys.executable, "-m", "lcft", *cmd, "--label", "first"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    _holding(first, out)
    # Two windows take the first well under a second once its ranks run: its launcher is paused (it keeps the
    # lock) while the second launches try, so that they meet it holding the folder on any machine.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        seconds = _second_launches([*cmd, "--label", "second"], (0.3, 1.0))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    for second in seconds:
        _refused(second, "lcft eval", out, first.pid)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert [c["label"] for c in json.loads((out / "eval.json").read_text())["checkpoints"]] == ["first"]


@pytest.mark.distributed
@pytest.mark.slow
def test_ranks_killed_by_signals_mid_step_are_exit_75_naming_each(tmp_path, data_dir, init_dir):  # noqa: F811
    """What the OOM killer does: SIGKILL to rank 1 of 3 after step 2, and a realtime signal to rank 2 (whose
    recording crashed torchrun's agent with a traceback: 'training processes failed (torchrun exit code 1)'); rank
    0 is left to the agent to end. The launcher exits 75 (a scheduler requeues it) naming each killed rank, its node
    and its signal, and --resume auto would continue."""
    out = tmp_path / "run"
    proc = start_train(data_dir, init_dir, out, "--nproc", 3, "--steps", 100000, "--save-every", 0,
                       run=_with(RUN, "--global-batch", "3"))
    wait_for_step(out, 2, [proc])
    victims = {rank: rank_process(proc, rank) for rank in (1, 2)}
    # The agent, paused while both die, finds them dead in one look (as two killed at once): between two of its
    # looks it would end the other one itself, named or not as it found it then.
    agent = psutil.Process(proc.pid).children()[0]
    agent.suspend()
    try:
        victims[1].send_signal(signal.SIGKILL)
        victims[2].send_signal(40)
        deadline = time.monotonic() + 60
        while any(v.status() != psutil.STATUS_ZOMBIE for v in victims.values()):
            assert time.monotonic() < deadline, "a killed rank did not end"
            time.sleep(0.01)
    finally:
        agent.resume()
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    # (torch's agent logged each worker's exit code, and the other worker it ended, in lines of its own)
    assert [line for line in err.splitlines() if line.strip()] == errors, err[-3000:]
    for rank, name in ((1, "SIGKILL"), (2, "SIGRTMIN+6")):
        assert f"rank {rank} on node 0 (pid {victims[rank].pid}) was killed by {name}" in errors[0], errors
    assert "--resume auto" in errors[0]


def _pending(p: psutil.Process, signum: int) -> bool:
    """Whether signal `signum` waits for process `p` (its process-wide pending set, /proc/PID/status ShdPnd)."""
    for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_the_agent_ends_with_its_group_does_not_say_it_saves(tmp_path, data_dir, init_dir):  # noqa: F811
    """Rank 1 SIGKILLed: torch's agent SIGTERMs rank 0 with the failed group. Rank 0 (held frozen until that
    SIGTERM waits for it, so that it takes the signal before it sees its peer gone) ends as the group does, without
    'received SIGTERM: saving a checkpoint after this step': nothing is saved, and the launcher's one line says so."""
    out = tmp_path / "run"
    proc = start_train(data_dir, init_dir, out, "--nproc", 2, "--steps", 100000, "--save-every", 0)
    wait_for_step(out, 2, [proc])
    survivor, victim = rank_process(proc, 0), rank_process(proc, 1)
    survivor.suspend()
    try:
        victim.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not _pending(survivor, signal.SIGTERM):
            assert time.monotonic() < deadline, "the agent did not end the group"
            time.sleep(0.01)
    finally:
        survivor.resume()
    said, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, err[-3000:]
    assert "received SIGTERM" not in said + err and "saving a checkpoint" not in said + err, said + err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and f"rank 1 on node 0 (pid {victim.pid}) was killed by SIGKILL" in errors[0], err[-3000:]


# Put first on the workers' PYTHONPATH: rank 1 SIGKILLs itself as it enters its second sharded save (step 2's),
# while rank 0 is inside the same collective save with the temp folder open. torch's own `dcp.save` is wrapped, so
# the fault sits where the OOM killer would strike whichever lcft module calls it.
KILL_RANK1_IN_SECOND_SAVE = """
import os, signal
if os.environ.get("RANK") == "1":
    import torch.distributed.checkpoint as dcp
    _save, _calls = dcp.save, []
    def save(*args, **kwargs):
        _calls.append(1)
        if len(_calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return _save(*args, **kwargs)
    dcp.save = save
"""


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_killed_by_sigkill_during_a_sharded_save_is_exit_75_and_resumes(tmp_path, data_dir, init_dir):  # noqa: F811
    """--shard fsdp, a checkpoint every step: rank 1 SIGKILLed inside step 2's sharded save. The launcher exits
    75 naming the rank and the signal; step 1 stays complete (its checksums verify), no step 2 appears; --resume
    auto continues from step 1 and leaves no temp folder of the interrupted save (rank 0 removes it when it sees the
    collective fail, the resume when rank 0 was ended first)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_RANK1_IN_SECOND_SAVE)
    out = tmp_path / "run"
    args = ("--nproc", 2, "--shard", "fsdp", "--save-every", 1)
    path = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = start_train(data_dir, init_dir, out, *args, "--steps", 3, env={"PYTHONPATH": path})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    errors = error_lines(err)
    assert len(errors) == 1 and "rank 1 on node 0" in errors[0] and "killed by SIGKILL" in errors[0], err[-3000:]
    assert "--resume auto" in errors[0]
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == ["step-00000001"]
    assert verify_checkpoint(out / "checkpoints" / "step-00000001")

    resumed = start_train(data_dir, init_dir, out, *args, "--steps", 2, "--resume", "auto")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert "resumed from" in err and "step-00000001" in err, err[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_sigkilled_launcher_leaves_no_worker_running(tmp_path, data_dir, init_dir):  # noqa: F811
    out = tmp_path / "run"
    proc = start_train(data_dir, init_dir, out, "--nproc", 2, "--steps", 100000, "--save-every", 0)
    wait_for_step(out, 1, [proc])
    below = psutil.Process(proc.pid).children(recursive=True)  # the agent and both workers
    assert len(below) >= 3
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    gone, alive = psutil.wait_procs(below, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    # Its temporary folder is left (in this test's TMPDIR), with what a launch writes there: the next launch removes it.
    left = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("lcft-launch-")]
    assert len(left) == 1 and {"spec.toml", "spare", "logs", "ready"} <= set(os.listdir(left[0])), left
    with launch_folder():
        assert not left[0].exists()
