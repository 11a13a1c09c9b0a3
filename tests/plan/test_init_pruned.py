"""`lcft plan --init` of another run's checkpoint while that run prunes it (--keep-last) or saves it again:
config.json, lcft.json and what they say are read as one checkpoint. A run folder (its latest) is resolved
again and read once more; a checkpoint named itself that changes meanwhile is one line saying so (never one
checkpoint's model planned beside another's files)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import lcft.checkpoint.hf_folder as hf_folder
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.cli.app import app
from lcft.model import Llama
from tests.checkpoint.conftest import save_pruning
from tests.one_line import cli_fails
from tests.train.conftest import small_model_config

PLAN = ["--seq-len", "512", "--gpu-memory", "80GiB"]


def _save_step(run: Path, step: int, tmp_path: Path, layers: int) -> Path:
    """The run saving `step` (a small model of `layers` blocks) and pruning the others, as `--keep-last 1` does."""
    torch.manual_seed(step)
    shape = dataclasses.replace(small_model_config(), num_hidden_layers=layers)
    model = save_pretrained(Llama(shape), tmp_path / f"m{step}-{layers}")
    return save_pruning(run, step, model)


def _saves_after_config_reads(monkeypatch, saves: list) -> None:
    """After each of the first len(saves) reads of a checkpoint's config.json by the plan, the run saves (the next
    of `saves`)."""
    real, left = hf_folder.read_config, list(saves)

    def read_then_saved(*args, **kwargs):
        got = real(*args, **kwargs)
        if left:
            left.pop(0)()
        return got

    monkeypatch.setattr(hf_folder, "read_config", read_then_saved)


def test_plan_of_a_run_whose_latest_is_pruned_plans_its_new_latest(tmp_path, monkeypatch):
    run = tmp_path / "base"
    _save_step(run, 1, tmp_path, layers=2)
    _saves_after_config_reads(monkeypatch, [lambda: _save_step(run, 2, tmp_path, layers=3)])
    r = CliRunner().invoke(app, ["plan", "--init", str(run), *PLAN])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "(3 blocks, hidden 64" in r.output and "verdict: fits" in r.output, r.output  # step 2's model


@pytest.mark.parametrize("change", ["pruned", "saved again with another model"])
def test_plan_of_a_checkpoint_changed_while_read_is_one_line(tmp_path, monkeypatch, change):
    run = tmp_path / "base"
    ckpt = _save_step(run, 1, tmp_path, layers=2)
    step = 2 if change == "pruned" else 1  # a resumed run saving step 1 again: a model of 3 blocks
    _saves_after_config_reads(monkeypatch, [lambda: _save_step(run, step, tmp_path, layers=3)])
    cli_fails(["plan", "--init", str(ckpt), *PLAN], str(ckpt), "removed or replaced while")


def test_plan_of_a_run_pruned_at_each_read_is_read_twice_then_one_line(tmp_path, monkeypatch):
    run = tmp_path / "base"
    _save_step(run, 1, tmp_path, layers=2)
    _saves_after_config_reads(monkeypatch, [lambda: _save_step(run, 2, tmp_path, layers=2),
                                            lambda: _save_step(run, 3, tmp_path, layers=2)])
    cli_fails(["plan", "--init", str(run), *PLAN], "step-00000002", "removed or replaced while")
    assert (run / "checkpoints" / "step-00000003").is_dir()
