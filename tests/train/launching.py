"""Helpers of the launch fault tests: `lcft train` as a real command line, its processes, faults from outside."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.liveness import NODE_RANK_ENV
from lcft.train.metrics import read_metrics

# Every variable a launcher (torchrun's agent, Open MPI, MPICH/Intel MPI, MVAPICH, srun, sbatch) sets per process:
# tests of what a launch environment means start from one without them (the tests themselves may run under one).
LAUNCH_NAMES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                "ROLE_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
                "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
MPI_SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
"""What mpirun and srun set to the number of copies they started of a command."""

# The small run of these tests: 512-token sequences, 2 per step, fp32, checkpoints every 2 steps, all kept.
RUN = ["--seq-len", "512", "--global-batch", "2", "--precision", "fp32", "--warmup", "2", "--lr", "1e-3",
       "--keep-last", "0", "--no-progress"]


def start_train(data: Path, init: Path, out: Path, *args: Any, env: dict[str, str] | None = None,
                wrap: tuple[str, ...] = (), run: list[str] = RUN) -> subprocess.Popen:
    """`python -m lcft train` with the small run's options (or `run`) and `args`, stdout and stderr captured; `env`
    adds to the environment; `wrap` is a command that runs it (ending in its argument list, and exec'ing it in
    place)."""
    cmd = [*wrap, sys.executable, "-m", "lcft", "train", "--data", str(data), "--init", str(init), "--out", str(out),
           *run, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def start_worker(spec: Path, rank: int, world: int, port: int, restarts: int = 0,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m lcft.launch train SPEC` as torchrun's agent starts rank `rank` of `world` (one per node, rank 0
    serving the store at 127.0.0.1:port) after `restarts` restarts of its node, without a launcher's files:
    stdout and stderr captured; `env` adds to (and replaces in) the environment."""
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCH_NAMES}
    given = dict(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="by-hand", TORCHELASTIC_USE_AGENT_STORE="False",
                 TORCHELASTIC_RESTART_COUNT=str(restarts), OMP_NUM_THREADS="1", **{NODE_RANK_ENV: str(rank)})
    return subprocess.Popen([sys.executable, "-m", "lcft.launch", "train", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**clean, **given, **(env or {})})


def wait_for_step(run: Path, step: int, procs: list[subprocess.Popen], timeout: float = 240) -> None:
    """Until metrics.jsonl holds `step` records; fails if a process ended first or time ran out."""
    deadline = time.monotonic() + timeout
    while _steps(run) < step:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"ended before step {step} (exit {p.returncode}): {p.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no step {step} after {timeout} s")
        time.sleep(0.05)


def _steps(run: Path) -> int:
    try:
        return len(read_metrics(run))
    except ValueError:  # a line being written
        return 0


@dataclass
class Ended:
    """How a started command ended: its exit code, stdout and stderr, and when (time.monotonic())."""
    code: int
    out: str
    err: str
    at: float


def ending(proc: subprocess.Popen, timeout: float) -> Callable[[], Ended]:
    """Read `proc`'s output until it ends on a thread of its own, so that the test can start other runs meanwhile
    (a run that waits out a timeout beside one that starts): the call returned waits for that end and says how
    and when it came. Past `timeout` s it kills the command's processes and raises subprocess.TimeoutExpired."""
    box: list[Ended | BaseException] = []

    def wait() -> None:
        try:
            out, err = proc.communicate(timeout=timeout)
            box.append(Ended(proc.returncode, out, err, time.monotonic()))
        except BaseException as e:  # (raised where the test waits for it)
            with contextlib.suppress(psutil.Error):
                kill_tree(proc)
            box.append(e)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()

    def ended() -> Ended:
        thread.join()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    return ended


@contextlib.contextmanager
def killed_on_failure() -> Iterator[list[subprocess.Popen]]:
    """A list for the commands a block starts: if the block fails, each is killed with its processes (a run left
    frozen, or training on, would outlive the test)."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    except BaseException:
        for proc in started:
            with contextlib.suppress(psutil.Error):
                kill_tree(proc)
        raise


def rank_process(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    """The worker process of global `rank` under a launcher (from the environment torchrun gave it)."""
    for p in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if p.environ().get("RANK") == str(rank) and "lcft.launch" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no worker of rank {rank} under pid {launcher.pid}")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and everything under it (torchrun, its workers): a node that vanishes."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def error_lines(stderr: str) -> list[str]:
    """The one-line `error: ...` messages of a command's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


TORCH_LOG = re.compile(r"[DIWEC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
"""The head of a line of torch's Python logging (level, date, time, pid, file:line)."""


def torch_logs(stderr: str) -> list[str]:
    """The lines of torch's Python logging (its elastic agent's, a worker's) in a command's stderr."""
    return [line for line in stderr.splitlines() if TORCH_LOG.match(line)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(run: Path) -> torch.Tensor:
    return torch.tensor([r["loss"] for r in read_metrics(run)], dtype=torch.float64)


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return from_pretrained(ckpt).state_dict()
