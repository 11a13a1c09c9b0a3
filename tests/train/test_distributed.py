"""Data parallelism on CPU (gloo, 2 processes via torchrun): equal to accumulation on one process, and a
run resumes on another world size with the same samples in the same order."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.state import read_state
from lcft.launch import run
from lcft.train import TrainConfig, latest_checkpoint, train
from lcft.train.metrics import read_metrics
from tests.train.launching import error_lines, rank_process, start_train, wait_for_step

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir, init_dir):
    """two: 2 processes x micro-batch 1, stopped after 3 of 6 steps (checkpoint at 3), then resumed on 1 process
    (accumulation 2). one: 1 process x accumulation 2, 6 steps straight, checkpoint at 3 and 6."""
    root = tmp_path_factory.mktemp("dp")
    base = dict(data=str(data_dir), init=str(init_dir), seq_len=512, steps=6, global_batch=2, micro_batch=1,
                warmup=2, lr=1e-3, precision="fp32", save_every=3, keep_last=0, progress=False)
    two = run("train", TrainConfig(out=str(root / "two"), nproc=2, stop_after=3, **base))
    assert two["world_size"] == 2 and two["step"] == 3 and two["stopped"] == "stop_after"
    two_metrics = read_metrics(root / "two")
    resumed = train(TrainConfig(out=str(root / "two"), resume="auto", **base))
    assert resumed["world_size"] == 1 and resumed["step"] == 6
    assert train(TrainConfig(out=str(root / "one"), **base))["world_size"] == 1
    return root, two_metrics, read_metrics(root / "two"), read_metrics(root / "one")


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return from_pretrained(ckpt).state_dict()


def test_two_processes_equal_one_with_accumulation(runs):
    root, two, _, one = runs
    assert [r["step"] for r in two] == [1, 2, 3]
    assert [r["samples"] for r in two] == [r["samples"] for r in one[:3]]
    torch.testing.assert_close(torch.tensor([r["loss"] for r in two]), torch.tensor([r["loss"] for r in one[:3]]),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor([r["grad_norm"] for r in two]),
                               torch.tensor([r["grad_norm"] for r in one[:3]]), rtol=1e-5, atol=1e-5)
    a = _weights(root / "two" / "checkpoints" / "step-00000003")
    b = _weights(root / "one" / "checkpoints" / "step-00000003")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_resume_on_another_world_size(runs):
    """Steps 4-6 ran on 1 process after steps 1-3 on 2: same samples in the same order as the straight run."""
    root, _, resumed, one = runs
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [r["samples"] for r in resumed] == [r["samples"] for r in one]
    torch.testing.assert_close(torch.tensor([r["loss"] for r in resumed]), torch.tensor([r["loss"] for r in one]),
                               rtol=1e-5, atol=1e-5)
    a = _weights(root / "two" / "checkpoints" / "step-00000006")
    b = _weights(root / "one" / "checkpoints" / "step-00000006")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_sigterm_to_the_launcher_checkpoints_all_ranks(tmp_path, data_dir, init_dir):
    """`lcft train --nproc 2`, then SIGTERM to that (parent) process: the workers finish the step, save,
    and the command exits 143 (128 + SIGTERM), not 0: the run is not finished."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "lcft", "train", "--data", str(data_dir), "--init", str(init_dir), "--out", str(run),
           "--seq-len", "512", "--steps", "100000", "--global-batch", "2", "--nproc", "2", "--precision", "fp32",
           "--save-every", "0", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and len(read_metrics(run)) < 2:
        time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]  # 128 + SIGTERM: stopped with a checkpoint, not finished
    ckpt = latest_checkpoint(run)
    state = read_state(ckpt)
    assert state.world_size == 2 and state.step == read_metrics(run)[-1]["step"] >= 2
    assert json.loads((run / "summary.json").read_text())["stopped"] == "signal"


@pytest.mark.parametrize(("sig", "shard"), [(signal.SIGTERM, "none"), (signal.SIGINT, "fsdp")])
def test_a_signal_to_rank_1_alone_stops_the_run_under_its_name(tmp_path, data_dir, init_dir, sig, shard):
    """A stop signal that reaches rank 1's worker only (a node's launcher passes it on to its own workers; rank 0
    and this launcher get none): every rank saves the same step, and the command exits 128 + N naming the
    signal. Exit 0 would tell a scheduler the run finished, and it would not be requeued."""
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--steps", 100000, "--save-every", 0, "--nproc", 2, "--shard", shard)
    wait_for_step(run, 2, [proc])
    rank_process(proc, 1).send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert error_lines(err) == [] and f"stopped by {sig.name} at step" in out
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["stopped"], summary["signal"], summary["world_size"]) == ("signal", sig.name, 2)
    assert read_state(latest_checkpoint(run)).step == read_metrics(run)[-1]["step"] == summary["step"] >= 2
