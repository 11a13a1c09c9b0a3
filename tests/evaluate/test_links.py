"""`lcft eval` into a folder where links were planted: a `.lcft.lock`, an `.eval.json.tmp`, the `.partial` folder
of its kept losses and the note beside a pass's losses, pointing outside it, are replaced by files of its own; the
outside files are untouched and the report is complete."""

from __future__ import annotations

import json

import numpy as np

from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.evaluate.store import PARTIAL, LossStore
from lcft.files import LOCK_NAME


def test_planted_lock_and_temp_links_are_not_followed(tmp_path, data_dir, ckpt_a):
    out = tmp_path / "eval"
    out.mkdir()
    victims = {}
    for name in (LOCK_NAME, ".eval.json.tmp"):
        victims[name] = tmp_path / f"victim{name}"
        victims[name].write_text("keep me\n")
        (out / name).symlink_to(victims[name])
    report = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a),), max_windows=1, out=str(out)))
    assert all(v.read_text() == "keep me\n" for v in victims.values())
    assert json.loads((out / "eval.json").read_text())["checkpoints"][0]["loss"] == report["checkpoints"][0]["loss"]
    assert not (out / "eval.json").is_symlink() and not any((out / n).is_symlink() for n in victims)


def test_a_partial_folder_linked_elsewhere_is_not_written_through(tmp_path, data_dir, ckpt_a):
    out, elsewhere = tmp_path / "eval", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / PARTIAL).symlink_to(elsewhere)
    report = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a),), max_windows=1, out=str(out)))
    assert list(elsewhere.iterdir()) == []  # the losses and their note were kept there, and left there
    assert json.loads((out / "eval.json").read_text())["checkpoints"][0]["loss"] == report["checkpoints"][0]["loss"]


def test_a_link_beside_a_pass_is_replaced_not_followed(tmp_path):
    """The note naming what a pass's key stands for, written with its first losses: a link planted under its name
    is replaced by the note; the pass's losses are kept and read back."""
    out, victim = tmp_path / "eval", tmp_path / "victim"
    (out / PARTIAL).mkdir(parents=True)
    victim.write_text("keep me\n")
    store = LossStore(out, {"ckpt": "abc", "window": 512}, keep=8)
    store.path.with_suffix(".json").symlink_to(victim)
    assert store.resume_at(4, 1) == 0
    loss = np.arange(16, dtype=np.float32)
    store.add(0, loss, np.ones(16, bool))
    assert victim.read_text() == "keep me\n"
    note = store.path.with_suffix(".json")
    assert not note.is_symlink() and json.loads(note.read_text()) == {"ckpt": "abc", "window": 512}
    again = LossStore(out, {"ckpt": "abc", "window": 512}, keep=8)
    assert again.resume_at(4, 1) == 1 and np.array_equal(next(again.items(1))[1], loss[-8:])
