"""What a run's fingerprint holds of its inputs (lcft.train.run_dir.same_run): --data and --init compared by content,
so a node's own copy at another path is the same run and a copy of other windows or another model is not. And the
run folder as a start takes it: a step a failed save left aside is back before --resume auto chooses."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.checkpoint.layout import list_checkpoints, step_name
from lcft.checkpoint.save import write_checkpoint
from lcft.checkpoint.state import read_trainer_state
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.train import TrainConfig, train
from lcft.train.run_dir import same_run


def test_a_copy_of_the_inputs_elsewhere_is_the_same_run_and_other_windows_are_not(tmp_path, data_dir, init_dir):
    base = dict(out=str(tmp_path / "run"), seq_len=512)
    node0 = same_run(TrainConfig(data=str(data_dir), init=str(init_dir), **base))
    data, init = shutil.copytree(data_dir, tmp_path / "data"), shutil.copytree(init_dir, tmp_path / "init")
    assert same_run(TrainConfig(data=str(data), init=str(init), **base)) == node0
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["files"]["train.bin"]["sha256"] = "0" * 64  # windows prepared otherwise
    (data / "manifest.json").write_text(json.dumps(manifest))
    (init / "config.json").write_text((init / "config.json").read_text() + " ")  # another model's files
    other = same_run(TrainConfig(data=str(data), init=str(init), **base))
    assert {k for k in node0 if other[k] != node0[k]} == {"data", "init"}
    assert same_run(TrainConfig(data=str(tmp_path / "none"), **base))["data"] == "unreadable"


def _set_aside(run: Path, step: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`run`'s checkpoint of `step` as a save of that step again leaves it where the file system renamed it aside
    and then refused to rename either copy to its name: marked, for the next start to put back."""
    final, real = run / "checkpoints" / step_name(step), os.rename

    def fuse(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if Path(dst) == final:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        real(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "rename", fuse)
        with pytest.raises(LcftError, match="cannot rename it back"):
            write_checkpoint(run, step, lambda d: shutil.copytree(final, d, dirs_exist_ok=True), lambda d: None)
    [aside] = (run / "checkpoints").glob(".tmp-old-*")
    return aside


def test_resume_auto_resumes_from_a_step_a_failed_save_left_aside(tmp_path, base_cfg, monkeypatch):
    """Steps 1 and 2 saved; saving step 2 again left it aside, marked. `lcft train --resume auto` puts it back
    before it chooses, and resumes from step 2. It resumed from step 1, then put step 2 back and moved it to
    superseded/ as a step after the one resumed."""
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 2, "save_every": 1, "keep_last": 0}))
    aside = _set_aside(run, 2, monkeypatch)
    assert [p.name for _, p in list_checkpoints(run)] == [step_name(1)]
    r = CliRunner().invoke(app, ["train", "--data", base_cfg["data"], "--out", str(run), "--resume", "auto",
                                 "--steps", "3", "--seq-len", "512", "--global-batch", "2", "--precision", "fp32",
                                 "--warmup", "2", "--lr", "1e-3", "--no-progress"])
    assert r.exit_code == 0, r.output
    ckpt = run / "checkpoints" / step_name(2)
    assert f"{step_name(2)}, replaced by a save that failed, is back in place" in r.output
    assert f"resumed from {ckpt} (step 2, 1 process(es))" in r.output, r.output
    assert not (run / "superseded").exists() and not aside.exists()
    assert [p.name for _, p in list_checkpoints(run)] == [step_name(s) for s in (1, 2, 3)]
    assert read_trainer_state(run / "checkpoints" / step_name(3))[0].step == 3
