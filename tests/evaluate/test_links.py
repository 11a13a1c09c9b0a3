"""`lcft eval` into a folder where links were planted: a `.lcft.lock` and an `.eval.json.tmp` pointing outside it
are replaced by files of its own, the outside files untouched and the report complete; a link as the `.partial`
folder of its kept losses, or in it (or a second name of another file), stops the command with one line naming
it, nothing there removed or changed."""

from __future__ import annotations

import json

import numpy as np

from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.evaluate.store import PARTIAL, LossStore
from lcft.folder_lock import LOCK_NAME
from tests.one_line import cli_fails, one_line


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


def test_a_partial_folder_linked_elsewhere_is_refused_and_left(tmp_path, data_dir, ckpt_a):
    """A fresh start used to remove the link (and would write the losses into the folder it points to)."""
    out, elsewhere = tmp_path / "eval", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("keep me\n")
    out.mkdir()
    (out / PARTIAL).symlink_to(elsewhere)
    cli_fails(["eval", "--data", str(data_dir), "--checkpoint", str(ckpt_a), "--max-windows", "1", "--out", str(out)],
              str(out / PARTIAL), "is not a folder eval made", "remove it and re-run")
    assert (out / PARTIAL).is_symlink() and (out / PARTIAL).readlink() == elsewhere
    assert [p.name for p in elsewhere.iterdir()] == ["mine.txt"] and (elsewhere / "mine.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in out.iterdir()) == [PARTIAL]  # no report, no lock left


def test_a_link_beside_a_pass_is_refused_and_left(tmp_path):
    """The note naming what a pass's key stands for, written with its first losses: a link planted under its name
    stops the pass before a record is read or written; the link, what it points to and the pass's losses stay."""
    out, victim = tmp_path / "eval", tmp_path / "victim"
    victim.write_text("keep me\n")
    store = LossStore(out, {"ckpt": "abc", "window": 512}, keep=8)
    assert store.resume_at(4, 1) == 0
    store.add(0, np.arange(16, dtype=np.float32), np.ones(16, bool))
    kept = store.path.read_bytes()
    note = store.path.with_suffix(".json")
    note.unlink()
    note.symlink_to(victim)
    again = LossStore(out, {"ckpt": "abc", "window": 512}, keep=8)
    one_line(lambda: again.resume_at(4, 1), str(note), "is not a file eval wrote", f"or the whole {out / PARTIAL}")
    assert victim.read_text() == "keep me\n" and note.readlink() == victim and store.path.read_bytes() == kept


def test_a_pass_that_is_a_second_name_of_another_file_is_refused_and_left(tmp_path):
    """The kept losses are cut to their whole records and appended to in place: a hard link planted under a pass's
    name (a regular file all the same) stops the pass before a record is read or cut; the file it names keeps every
    byte (it was cut to nothing, then filled with losses)."""
    out, victim = tmp_path / "eval", tmp_path / "victim"
    victim.write_bytes(b"keep me\n" * 100)
    store = LossStore(out, {"ckpt": "abc", "window": 512}, keep=8)
    assert store.resume_at(4, 1) == 0
    store.add(0, np.arange(16, dtype=np.float32), np.ones(16, bool))
    store.path.unlink()
    store.path.hardlink_to(victim)
    again = LossStore(out, {"ckpt": "abc", "window": 512}, keep=8)
    one_line(lambda: again.resume_at(4, 1), str(again.path), "a second name of another file (a hard link)",
             f"or the whole {out / PARTIAL}")
    assert victim.read_bytes() == b"keep me\n" * 100 and victim.stat().st_nlink == 2
