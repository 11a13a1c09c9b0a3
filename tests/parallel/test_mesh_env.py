"""What the environment a process starts in says about its launch (lcft.liveness.launch_world, lcft.parallel.mesh.init_world):
a real torchrun launch (the elastic agent's TORCHELASTIC_RUN_ID beside env://'s variables), a copy of one left in a
shell, an MPI launcher's processes. Each is decided in this process, without waiting for a real rendezvous
timeout (the one wait left is bounded by a tiny --collective-timeout here)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from lcft.errors import LcftError
from lcft.evaluate import EvalConfig, evaluate
from lcft.launch import run
from lcft.liveness import launch_world
from lcft.parallel.mesh import init_world
from lcft.train import TrainConfig, train
from tests.parallel.harness import free_port, run_ranks
from tests.parallel.workers import join_restarted
from tests.train.launching import LAUNCH_NAMES, MPI_SIZES


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch):
    """A clean launch environment; returns a setter for the variables a test gives."""
    for name in LAUNCH_NAMES:
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()

    def given(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return given


def _stale(port: int) -> dict[str, str]:
    """A job script's env:// launch, left in the shell (`source job.sh`): no peer will ever come."""
    return {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert isinstance(e.value, LcftError) and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("which", ["full", "local_rank"])
def test_a_launch_environment_left_in_the_shell_is_refused_at_once(env, which):
    """Without torchrun's TORCHELASTIC_RUN_ID no launcher started this process: one line naming what to unset, not
    a wait of --collective-timeout for ranks that never come (nor, for LOCAL_RANK alone, Accelerate's traceback)."""
    stale = _stale(free_port())
    env(**(stale if which == "full" else {"LOCAL_RANK": "0"}))
    with pytest.raises(LcftError) as e:
        init_world(collective_timeout=1.0)
    msg = _one_line(e)
    assert all(f"{k}=" in msg for k in (stale if which == "full" else ["LOCAL_RANK"])), msg
    assert "TORCHELASTIC_RUN_ID" in msg and "--nproc" in msg and not dist.is_initialized()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_launch_whose_peers_never_come_ends_in_one_line_after_the_timeout(env, rank):
    """A torchrun environment (rank 0 hosting the store, or rank 1 reaching for rank 0's) whose peers never come:
    the wait is bounded by --collective-timeout and ends in one line naming the address, the world size and the
    timeout."""
    port = free_port()
    env(**{**_stale(port), "RANK": rank, "LOCAL_RANK": rank, "TORCHELASTIC_RUN_ID": "old",
           "TORCHELASTIC_USE_AGENT_STORE": "False"})
    with pytest.raises(LcftError) as e:
        init_world(collective_timeout=0.25)
    msg = _one_line(e)
    assert f"127.0.0.1:{port}" in msg and "2 processes" in msg and "--collective-timeout 0.25" in msg, msg
    assert not dist.is_initialized()


def test_a_copy_of_a_torchrun_workers_environment_is_refused_at_once(env):
    """torchrun's agent serves its store before it starts a worker: nothing listening there means no agent (a
    worker's environment copied into a shell), said at once rather than after the store's retries."""
    port = free_port()
    env(**{**_stale(port), "RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "old",
           "TORCHELASTIC_USE_AGENT_STORE": "True"})
    with pytest.raises(LcftError) as e:
        init_world(collective_timeout=5.0)  # the probe answers at once: the timeout is never waited for
    msg = _one_line(e)
    assert f"127.0.0.1:{port}" in msg and "TORCHELASTIC_RUN_ID=old" in msg and "WORLD_SIZE" in msg, msg


@pytest.mark.parametrize("size", MPI_SIZES)
def test_one_of_several_mpi_processes_is_refused(env, size):
    """`mpirun -n 4 lcft train` (or srun -n 4): each process would train alone into the same folder (on CPU,
    Accelerate would join them on its own fixed port); one line saying how lcft starts processes instead."""
    env(**{size: "4"})
    with pytest.raises(LcftError) as e:
        launch_world()
    msg = _one_line(e)
    assert f"{size}=4" in msg and "--nproc" in msg and "torchrun" in msg, msg


def test_a_launch_by_torchrun_inside_an_mpi_or_slurm_job_is_kept(env):
    """srun/mpirun starting torchrun (or lcft --nproc) once per node: its workers carry the job's sizes too."""
    env(OMPI_COMM_WORLD_SIZE="1", SLURM_STEP_NUM_TASKS="1")
    assert launch_world() == 1
    env(SLURM_STEP_NUM_TASKS="2", WORLD_SIZE="4", RANK="3", LOCAL_RANK="1", MASTER_ADDR="node0", MASTER_PORT="29500",
        TORCHELASTIC_RUN_ID="run")
    assert launch_world() == 4


@pytest.mark.parametrize("step", [{"SLURM_STEP_NUM_TASKS": "1"}, {}])
def test_one_task_in_a_larger_slurm_allocation_is_one_process(env, step):
    """`sbatch -n 4` then `srun -n 1 lcft train` inside it, or the batch script running it itself: SLURM_NTASKS is
    the job's 4 (srun(1): "total number of processes in the current job"), the step's count (SLURM_STEP_NUM_TASKS,
    "number of processes in the step") 1 or unset: one process, not one of 4."""
    env(SLURM_NTASKS="4", **step)
    assert launch_world() == 1


@pytest.mark.parametrize("given", [{"LOCAL_RANK": "0"}, {"PMI_SIZE": "2"}])
@pytest.mark.parametrize("job", ["train", "eval"])
@pytest.mark.parametrize("through", ["job", "launch.run"])
def test_train_and_eval_decide_the_launch_before_reading_anything(env, job, given, through, tmp_path):
    """A launch environment no launcher made is refused first, by the job itself and through lcft.launch.run (the
    CLI's way in, whose own checks come after it): nothing read (the data here does not exist, and eval's --cp 2
    would not divide one process) and nothing written."""
    env(**given)
    out, none = tmp_path / "out", str(tmp_path / "none")
    cfg = (TrainConfig(data=none, out=str(out), preset="tiny", steps=1, global_batch=1) if job == "train" else
           EvalConfig(data=none, checkpoints=(none,), out=str(out), cp=2))
    with pytest.raises(LcftError) as e:
        if through == "launch.run":
            run(job, cfg)
        else:
            (train if job == "train" else evaluate)(cfg)
    name, value = next(iter(given.items()))
    assert f"{name}={value}" in _one_line(e) and not out.exists()


def test_the_ranks_of_a_restarted_group_agree_on_its_restarts():
    """After one node's worker died its agent counts the restart, while another node's agent may restart its
    workers for the membership change without counting it: TORCHELASTIC_RESTART_COUNT 0 and 1 in one group. Every
    rank takes the group's (the highest), and the heartbeats meet under it: each knows the other's pid when the
    group is joined (with the counts as given, each waited 60 s under its own count and knew nobody)."""
    results = run_ranks(join_restarted, 2, [0, 1], init=False)
    assert [restarts for restarts, _, _ in results] == [1, 1]
    pids = {rank: pid for rank, (_, _, pid) in enumerate(results)}
    assert [peers for _, peers, _ in results] == [pids, pids]
