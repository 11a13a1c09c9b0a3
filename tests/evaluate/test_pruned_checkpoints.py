"""Eval of a run's checkpoint that the run prunes or saves again between eval's checks and its reading of the
model (a training run writing into the run folder meanwhile): one line saying so, never the other weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.layout import CheckpointChanged
from lcft.checkpoint.save import remove_checkpoint, write_checkpoint
from lcft.evaluate import EvalConfig
from lcft.evaluate.checkpoints import load_model, prepare_checkpoints
from lcft.genomics.window_set import open_windows
from tests.evaluate.conftest import WINDOW, save_model
from tests.one_line import one_line


def _run_with_step(tmp_path: Path, data_dir: Path) -> tuple[Path, list]:
    """A run folder whose only checkpoint is step 1, prepared for eval as `lcft eval -c RUN` does."""
    run = tmp_path / "run"
    write_checkpoint(run, 1, lambda tmp: shutil.copytree(save_model(tmp_path / "m1", seed=1), tmp, dirs_exist_ok=True),
                     lambda tmp: None)
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(run),), out=str(tmp_path / "report"), max_windows=1)
    return run, prepare_checkpoints(cfg, WINDOW, open_windows(data_dir, "eval").manifest["tokenizer"])


def test_a_checkpoint_pruned_before_its_model_is_read_is_one_line(tmp_path, data_dir):
    run, infos = _run_with_step(tmp_path, data_dir)
    remove_checkpoint(infos[0].path)  # the run's --keep-last prune, as train does it
    one_line(lambda: load_model(infos[0], torch.device("cpu")), str(infos[0].path), "removed or replaced while",
             "--keep-last", error=CheckpointChanged)


def test_a_checkpoint_saved_again_under_its_name_is_not_read_as_the_one_hashed(tmp_path, data_dir):
    run, infos = _run_with_step(tmp_path, data_dir)
    other = save_model(tmp_path / "m2", seed=2)  # a resumed run saving step 1 again: other weights, same name
    write_checkpoint(run, 1, lambda tmp: shutil.copytree(other, tmp, dirs_exist_ok=True), lambda tmp: None)
    with pytest.raises(CheckpointChanged, match="removed or replaced while"):
        load_model(infos[0], torch.device("cpu"))  # the report would record the first one's sha256
