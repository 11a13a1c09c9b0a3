"""Checkpoint test fixtures: the trainer's small windows and model (tests/train/conftest.py), and one sharded
(`--shard fsdp`, 2 gloo ranks) run with checkpoints at steps 1 and 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lcft.checkpoint.dcp import is_sharded_checkpoint
from lcft.launch import run as launch
from lcft.train import TrainConfig
from tests.train.conftest import _one_thread, data_dir, init_dir  # noqa: F401  (fixtures, by name)


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
