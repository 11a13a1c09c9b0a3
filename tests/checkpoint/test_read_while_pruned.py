"""A checkpoint a training run prunes, or saves again under its name, while `lcft export` streams it: one line
saying so, and no export published (never a model of two checkpoints' tensors); a run folder given (its latest)
is resolved again and read once more."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import lcft.checkpoint.reader as reader
from lcft.checkpoint.export import export_model
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.checkpoint.layout import CheckpointChanged
from lcft.checkpoint.reader import load
from lcft.checkpoint.save import remove_checkpoint
from lcft.cli.app import app
from lcft.model import Llama
from tests.checkpoint.conftest import save_pruning
from tests.one_line import cli_fails, one_line
from tests.train.conftest import small_model_config


def test_export_of_a_sharded_checkpoint_pruned_after_it_was_opened_is_one_line(tmp_path, ckpt: Path):
    source = load(ckpt, materialize=False)  # what `lcft export` holds before it streams the shards
    remove_checkpoint(ckpt)  # the run's --keep-last prune, as train does it
    out = tmp_path / "export"
    one_line(lambda: export_model(source, out), str(ckpt), "removed or replaced while", error=CheckpointChanged)
    assert not out.exists() and not list(tmp_path.glob(".export*"))


def test_export_of_a_sharded_checkpoint_saved_again_is_not_published(tmp_path, ckpt: Path):
    source = load(ckpt, materialize=False)
    earlier = ckpt.with_name("step-00000001")
    shutil.rmtree(ckpt)  # a resumed run saving this step again: another folder under the same name
    shutil.copytree(earlier, ckpt)
    out = tmp_path / "export"
    with pytest.raises(CheckpointChanged, match="removed or replaced while"):
        export_model(source, out)
    assert not out.exists()


def _pruning_before_reads(monkeypatch, run: Path, models: list[Path]) -> None:
    """Before each of the first len(models) checkpoint reads, the run saves the next of `models` as its next step
    and prunes the rest (--keep-last 1)."""
    real, left = reader.load, list(models)

    def pruning(path, *args, **kwargs):
        if left:
            save_pruning(run, int(path.name.split("-")[1]) + 1, left.pop(0))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reader, "load", pruning)


def test_export_of_a_run_whose_latest_is_pruned_exports_its_new_latest(tmp_path, monkeypatch, init_dir: Path):
    run = tmp_path / "run"
    save_pruning(run, 1, init_dir)
    torch.manual_seed(1)  # step 2's weights differ from step 1's
    other = save_pretrained(Llama(small_model_config()), tmp_path / "other")  # init_dir's shape
    _pruning_before_reads(monkeypatch, run, [other])
    res = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "export")])
    latest = run / "checkpoints" / "step-00000002"
    assert res.exit_code == 0 and f"(from{latest})" in "".join(res.output.split()), res.output  # (lines wrapped)
    got, want = load_file(tmp_path / "export" / "model.safetensors"), load_file(latest / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_export_of_a_checkpoint_named_itself_is_not_read_again(tmp_path, monkeypatch, init_dir: Path):
    run = tmp_path / "run"
    ckpt = save_pruning(run, 1, init_dir)
    _pruning_before_reads(monkeypatch, run, [init_dir])
    cli_fails(["export", str(ckpt), "--out", str(tmp_path / "export")], "removed or replaced while")
    assert not (tmp_path / "export").exists()


def test_export_of_a_run_pruned_at_each_read_is_read_twice_then_one_line(tmp_path, monkeypatch, init_dir: Path):
    run = tmp_path / "run"
    save_pruning(run, 1, init_dir)
    _pruning_before_reads(monkeypatch, run, [init_dir, init_dir])
    cli_fails(["export", str(run), "--out", str(tmp_path / "export")], "step-00000002", "removed or replaced while")
    assert (run / "checkpoints" / "step-00000003").is_dir() and not (tmp_path / "export").exists()
