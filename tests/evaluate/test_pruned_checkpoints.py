"""Eval of a run's checkpoint that the run prunes or saves again between eval's checks and its reading of the
model (a training run writing into the run folder meanwhile): a checkpoint named itself is one line saying so,
never the other weights; a run folder (its latest) is resolved again and read once more."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import lcft.evaluate.checkpoints as checkpoints
import lcft.evaluate.runner as runner
from lcft.checkpoint.layout import CheckpointChanged, latest_checkpoint
from lcft.checkpoint.save import remove_checkpoint, write_checkpoint
from lcft.checkpoint.weights import weights_sha256
from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.checkpoints import load_model, prepare_checkpoints
from lcft.genomics.window_set import open_windows
from tests.checkpoint.conftest import save_pruning
from tests.evaluate.conftest import WINDOW, save_model
from tests.one_line import one_line


def _save_step(run: Path, step: int, tmp_path: Path) -> Path:
    """The run saving `step` (a model of seed `step`) and pruning the others, as `--keep-last 1` does."""
    return save_pruning(run, step, save_model(tmp_path / f"m{step}", seed=step))


def _step_one(tmp_path: Path, data_dir: Path) -> tuple[Path, list]:
    """A run whose only checkpoint is step 1, named itself and prepared for eval (`lcft eval -c RUN/checkpoints/
    step-00000001`)."""
    run = tmp_path / "run"
    ckpt = _save_step(run, 1, tmp_path)
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(ckpt),), out=str(tmp_path / "report"), max_windows=1)
    return run, prepare_checkpoints(cfg, WINDOW, open_windows(data_dir, "eval").manifest["tokenizer"])


def test_a_checkpoint_pruned_before_its_model_is_read_is_one_line(tmp_path, data_dir):
    run, infos = _step_one(tmp_path, data_dir)
    remove_checkpoint(infos[0].path)  # the run's --keep-last prune, as train does it
    one_line(lambda: load_model(infos[0], torch.device("cpu")), str(infos[0].path), "removed or replaced while",
             "--keep-last", error=CheckpointChanged)


def test_a_checkpoint_saved_again_under_its_name_is_not_read_as_the_one_hashed(tmp_path, data_dir):
    run, infos = _step_one(tmp_path, data_dir)
    other = save_model(tmp_path / "m2", seed=2)  # a resumed run saving step 1 again: other weights, same name
    write_checkpoint(run, 1, lambda tmp: shutil.copytree(other, tmp, dirs_exist_ok=True), lambda tmp: None)
    with pytest.raises(CheckpointChanged, match="removed or replaced while"):
        load_model(infos[0], torch.device("cpu"))  # the report would record the first one's sha256


def _prunes_once(monkeypatch, module: object, name: str, run: Path, tmp_path: Path, after: bool) -> None:
    """`module.name` patched so that the run saves step 2 and prunes step 1 on its first call, before it runs
    (after=False) or once it returned (after=True)."""
    real, calls = getattr(module, name), []

    def pruning(*args, **kwargs):
        if not calls and not after:
            calls.append(_save_step(run, 2, tmp_path))
        got = real(*args, **kwargs)
        if not calls and after:
            calls.append(_save_step(run, 2, tmp_path))
        return got

    monkeypatch.setattr(module, name, pruning)


def test_a_run_whose_latest_is_pruned_before_its_model_is_read_is_evaluated_at_its_new_latest(tmp_path, data_dir,
                                                                                            monkeypatch):
    """`lcft eval -c RUN -c RUN` against a run that saves every step under --keep-last 1: the latest it resolved
    and checked is pruned before its model is read; eval resolves the run's latest again, and the report records
    that one, for both entries (a run listed twice, say with and without --max-context, is one checkpoint)."""
    run = tmp_path / "run"
    _save_step(run, 1, tmp_path)
    _prunes_once(monkeypatch, runner, "prepare_checkpoints", run, tmp_path, after=True)
    rep = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(run), str(run)), out=str(tmp_path / "report"), max_windows=1, bootstrap=10))
    latest = latest_checkpoint(run)
    assert latest is not None and latest.name == "step-00000002"
    for entry in rep["checkpoints"]:
        assert (entry["checkpoint"], entry["resolved"]) == (str(run), str(latest))
        assert entry["weights_sha256"] == weights_sha256(latest)


def test_a_run_whose_latest_is_pruned_while_it_is_checked_is_checked_at_its_new_latest(tmp_path, data_dir,
                                                                                      monkeypatch):
    run = tmp_path / "run"
    _save_step(run, 1, tmp_path)
    _prunes_once(monkeypatch, checkpoints, "weights_sha256", run, tmp_path, after=False)
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(run),), out=str(tmp_path / "report"), max_windows=1)
    (info,) = prepare_checkpoints(cfg, WINDOW, open_windows(data_dir, "eval").manifest["tokenizer"])
    latest = latest_checkpoint(run)
    assert latest is not None and (info.path, info.sha256) == (latest, weights_sha256(latest))


def test_a_run_whose_latest_is_pruned_again_while_read_again_is_one_line(tmp_path, data_dir, monkeypatch):
    """The run's latest is resolved again once: pruned at every read, the second change is the one line."""
    run = tmp_path / "run"
    _save_step(run, 1, tmp_path)
    real, step = checkpoints.load, [1]

    def pruning(*args, **kwargs):
        step[0] += 1
        _save_step(run, step[0], tmp_path)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "load", pruning)
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(run),), out=str(tmp_path / "report"), max_windows=1)
    one_line(lambda: evaluate(cfg), "step-00000002", "removed or replaced while", error=CheckpointChanged)
    assert step[0] == 3  # read twice


def test_each_checkpoint_is_verified_once_before_its_weights_are_hashed(tmp_path, data_dir, monkeypatch):
    """Every file of a checkpoint's checksums is hashed to verify it (optimizer state included): the check of
    --out against the checkpoints had resolved each one, verified, a second time."""
    import lcft.checkpoint.layout as layout

    run = tmp_path / "run"
    _save_step(run, 1, tmp_path)
    real, verified = layout.verify_checkpoint, []
    monkeypatch.setattr(layout, "verify_checkpoint", lambda ckpt: verified.append(ckpt) or real(ckpt))
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(run),), out=str(tmp_path / "report"), max_windows=1)
    prepare_checkpoints(cfg, WINDOW, open_windows(data_dir, "eval").manifest["tokenizer"])
    assert verified == [latest_checkpoint(run)]


def test_in_a_launch_a_run_pruned_while_read_is_one_line(tmp_path, data_dir, monkeypatch):
    """Each process of a launch resolves a run's latest on its own: resolved again, ranks could evaluate (or
    train from) different checkpoints. There the change is the one-line refusal."""
    from lcft.liveness import LAUNCHER_ENV

    run = tmp_path / "run"
    _save_step(run, 1, tmp_path)
    monkeypatch.setenv(LAUNCHER_ENV, "test")
    _prunes_once(monkeypatch, checkpoints, "weights_sha256", run, tmp_path, after=False)
    cfg = EvalConfig(data=str(data_dir), checkpoints=(str(run),), out=str(tmp_path / "report"), max_windows=1)
    one_line(lambda: prepare_checkpoints(cfg, WINDOW, open_windows(data_dir, "eval").manifest["tokenizer"]),
             "removed or replaced while", error=CheckpointChanged)
