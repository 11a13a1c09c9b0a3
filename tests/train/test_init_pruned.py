"""`lcft train --init` from another run's checkpoint while that run prunes it (--keep-last) or saves it again:
config.json, the tokenizer check and the weights are read as one checkpoint. A checkpoint named itself that
changes meanwhile is one line saying so (never one checkpoint's tokenizer checked and another's weights trained);
a run folder (its latest) is resolved again and read once more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import lcft.train.model_setup as model_setup
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.checkpoint.layout import CheckpointChanged
from lcft.model import Llama
from lcft.train import TrainConfig, train
from tests.checkpoint.conftest import save_pruning
from tests.one_line import one_line
from tests.train.conftest import small_model_config


def _save_step(run: Path, step: int, tmp_path: Path, **config: Any) -> Path:
    """The run saving `step` (a small model of seed `step`) and pruning the others, as `--keep-last 1` does."""
    torch.manual_seed(step)
    return save_pruning(run, step, save_pretrained(Llama(small_model_config(**config)), tmp_path / f"m{step}"))


def _saves_after_tokenizer_check(monkeypatch, save) -> None:
    """The run saves (`save()`) right after the --init checkpoint's tokenizer was first checked against the
    data."""
    real, saved = model_setup.check_tokenizer, []

    def checked_then_saved(*args, **kwargs):
        real(*args, **kwargs)
        if not saved:
            saved.append(save())

    monkeypatch.setattr(model_setup, "check_tokenizer", checked_then_saved)


@pytest.mark.parametrize("change", ["pruned", "saved again with another vocabulary"])
def test_an_init_checkpoint_changed_after_its_tokenizer_check_is_one_line(tmp_path, base_cfg, monkeypatch, change):
    run = tmp_path / "base"
    ckpt = _save_step(run, 1, tmp_path)
    if change == "pruned":
        _saves_after_tokenizer_check(monkeypatch, lambda: _save_step(run, 2, tmp_path))
    else:  # a resumed run saving step 1 again: a model of 32 ids where the check passed one of the data's 16
        _saves_after_tokenizer_check(monkeypatch, lambda: _save_step(run, 1, tmp_path / "again", vocab_size=32))
    cfg = TrainConfig(out=str(tmp_path / "out"), **{**base_cfg, "init": str(ckpt), "steps": 1})
    one_line(lambda: train(cfg), str(ckpt), "removed or replaced while", error=CheckpointChanged)


def test_init_from_a_run_whose_latest_is_pruned_starts_from_its_new_latest(tmp_path, base_cfg, monkeypatch):
    run = tmp_path / "base"
    _save_step(run, 1, tmp_path)
    _saves_after_tokenizer_check(monkeypatch, lambda: _save_step(run, 2, tmp_path))
    got = train(TrainConfig(out=str(tmp_path / "out"), **{**base_cfg, "init": str(run), "steps": 1, "lr": 0.0}))
    trained = load_file(Path(got["checkpoint"]) / "model.safetensors")
    latest = load_file(run / "checkpoints" / "step-00000002" / "model.safetensors")
    assert trained.keys() == latest.keys() and all(torch.equal(trained[k], latest[k]) for k in latest)
