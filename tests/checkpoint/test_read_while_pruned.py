"""A checkpoint a training run prunes, or saves again under its name, while `lcft export` streams it: one line
saying so, and no export published (never a model of two checkpoints' tensors)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lcft.checkpoint.export import export_model
from lcft.checkpoint.layout import CheckpointChanged
from lcft.checkpoint.reader import load
from lcft.checkpoint.save import remove_checkpoint
from tests.one_line import one_line


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
