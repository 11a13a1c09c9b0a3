"""Checkpoint test fixtures: the trainer's small windows and model (tests/train/conftest.py), one one-process run
with checkpoints per module (and a copy of it per test), and one sharded (`--shard fsdp`, 2 gloo ranks) run with
checkpoints at steps 1 and 2."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from lcft.checkpoint.model_files import is_sharded_checkpoint
from lcft.checkpoint.save import prune, write_checkpoint
from lcft.launch import run as launch
from lcft.train import TrainConfig, train
from tests.train.conftest import data_dir, init_dir  # noqa: F401  (fixtures, by name)


@pytest.fixture(scope="session")
def sharded_run(tmp_path_factory, data_dir: Path, init_dir: Path) -> tuple[Path, dict]:  # noqa: F811
    cfg = dict(data=str(data_dir), init=str(init_dir), seq_len=512, steps=2, global_batch=2, micro_batch=1,
               warmup=1, lr=1e-3, precision="fp32", save_every=1, progress=False)
    run = tmp_path_factory.mktemp("sharded") / "run"
    launch("train", TrainConfig(out=str(run), nproc=2, shard="fsdp", **cfg))
    return run, cfg


@pytest.fixture
def ckpt(tmp_path, sharded_run) -> Path:
    """A copy of the run's step 2 (sharded: lcft.json says so)."""
    dst = tmp_path / "run"
    shutil.copytree(sharded_run[0], dst)
    path = dst / "checkpoints" / "step-00000002"
    assert is_sharded_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def saved_run(request, tmp_path_factory, data_dir: Path, init_dir: Path) -> tuple[Path, dict[str, Any]]:  # noqa: F811
    """A one-process run, trained once per module: 6 steps with checkpoints at 2, 4 and 6, or what the module's
    SAVED_RUN (steps, warmup, save_every) says. Tests that damage it take `run_copy`."""
    cfg = dict(data=str(data_dir), init=str(init_dir), seq_len=512, steps=6, global_batch=2, micro_batch=1,
               warmup=2, lr=1e-3, precision="fp32", save_every=2, progress=False)
    cfg.update(getattr(request.module, "SAVED_RUN", {}))
    run = tmp_path_factory.mktemp("saved") / "run"
    train(TrainConfig(out=str(run), **cfg))
    return run, cfg


@pytest.fixture
def run_copy(tmp_path, saved_run) -> tuple[Path, dict[str, Any]]:
    """A copy of `saved_run` and its config aimed at the copy."""
    run, cfg = saved_run
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst, {**cfg, "out": str(dst)}


def save_pruning(run: Path, step: int, model: Path) -> Path:
    """A run saving `step` (the model folder `model`) and then pruning its other checkpoints, as a training run
    under --keep-last 1 does while other commands read them; the new checkpoint."""
    saved = write_checkpoint(run, step, lambda tmp: shutil.copytree(model, tmp, dirs_exist_ok=True), lambda tmp: None)
    prune(run, 1)
    return saved
