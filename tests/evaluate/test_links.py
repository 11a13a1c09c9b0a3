"""`lcft eval` into a folder where links were planted: a `.lcft.lock` and an `.eval.json.tmp` pointing outside it
are replaced by files of its own; the outside files are untouched and the report is complete."""

from __future__ import annotations

import json

from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
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
