"""Checkpoints under attack and damage: crafted pickles refused and not run, corrupt trainer state as one-line
errors pointing to the previous checkpoint, checksums with fallback, resume superseding later steps, changed
optimizer options applied on resume, --keep-last keeping a verified checkpoint."""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.layout import CHECKSUMS, list_checkpoints, resolve_checkpoint, verify_checkpoint
from lcft.checkpoint.save import prune, write_checkpoint, write_checksums
from lcft.checkpoint.state import read_trainer_state
from lcft.errors import LcftError
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics
from tests.one_line import cli_fails, one_line
from tests.test_files import plant
from tests.unprivileged import unprivileged

STATE = "trainer_state"


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


class Payload:
    """Unpickling this runs code: it writes a marker file (what an attacker's payload would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.mark.parametrize("name", ["rng.pt", "optimizer.pt", "scheduler.pt"])
def test_crafted_pickle_in_trainer_state_is_refused_and_not_run(run_copy, tmp_path, name):
    """The real content plus a payload (what resumed with exit 0 before): refused with a one-line error naming
    the file and the previous checkpoint; the payload never runs."""
    run, cfg = run_copy
    path = ckpt(run, 6) / STATE / name
    marker = tmp_path / "pwned"
    real = torch.load(path, weights_only=True)
    torch.save({**real, "payload": Payload(marker)}, path)
    # the oracle: an unrestricted load of this file does run the payload
    torch.load(path, weights_only=False)
    assert marker.read_text() == "ran"
    marker.unlink()
    write_checksums(ckpt(run, 6))  # an attacker recomputes the checksums: the loader itself must refuse
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 6))}))
    msg = str(e.value)
    assert str(path) in msg and "refused" in msg and "\n" not in msg
    assert "weights_only" not in msg  # not torch's advice to load it unrestricted
    assert f"--resume {ckpt(run, 4)}" in msg
    assert not marker.exists()
    # a bare pickle file (not torch's zip format) is not run either
    path.write_bytes(pickle.dumps(Payload(marker)))
    write_checksums(ckpt(run, 6))
    with pytest.raises(LcftError, match=name):
        read_trainer_state(ckpt(run, 6))
    assert not marker.exists()


@pytest.mark.parametrize("name,damage,word", [
    ("optimizer.pt", b"garbage, not a torch file", "optimizer.pt: corrupt"),
    ("rng.pt", None, "rng.pt: corrupt"),  # truncated to half
    ("state.json", b'{"step": 6, "samples', "state.json: not valid JSON"),
    ("state.json", b'{"step": "six"}', "state.json"),
    ("scheduler.pt", b"", "scheduler.pt: corrupt"),
    ("state.json", b'{"step": 6, "guard_history": "abc"}', "state.json: corrupt"),
    ("state.json", b'{"step": 6, "data": "train.bin"}', "state.json: corrupt"),
    ("rng.pt", "wrong-layout", "rng.pt: corrupt"),
    ("state.json", b'{"step": 6, "stepz": 1}', "lcft version (field 'stepz')"),
    ("state.json", b'{"step": 6, "\\nx\\u001b[2J": 1}', r"lcft version (field '\nx\x1b[2J')"),  # shown, not run
])
def test_corrupt_trainer_state_is_one_line_naming_file_and_previous(run_copy, name, damage, word):
    run, cfg = run_copy
    path = ckpt(run, 6) / STATE / name
    if damage == "wrong-layout":  # plain tensors, the right keys, not RNG states
        torch.save({"python": [1, 2, 3], "numpy": [], "torch": torch.zeros(3)}, path)
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] if damage is None else damage)
    write_checksums(ckpt(run, 6))  # damage the checksums would not catch (e.g. made before they were written)
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 6)), "steps": 8}))
    msg = str(e.value)
    assert word in msg and "\n" not in msg and "Traceback" not in msg
    assert f"--resume {ckpt(run, 4)}" in msg


def flip_byte(path: Path, at: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checksums_written_last_and_checked(run_copy):
    run, _ = run_copy
    c = ckpt(run, 6)
    listed = json.loads((c / CHECKSUMS).read_text())["files"]
    on_disk = sorted(p.relative_to(c).as_posix() for p in c.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    assert sorted(listed) == on_disk and "trainer_state/optimizer.pt" in listed
    assert verify_checkpoint(c) is True
    flip_byte(c / "model.safetensors")
    with pytest.raises(LcftError, match="model.safetensors"):
        verify_checkpoint(c)


def test_resume_auto_falls_back_to_newest_good_checkpoint(run_copy, capsys):
    """step-6's weights damaged: --resume auto says so, resumes from step 4, and the run ends at 6 with a new,
    verified step-6 (the damaged one moved to superseded/); the losses equal the undamaged run's."""
    run, cfg = run_copy
    before = [r["loss"] for r in read_metrics(run)]
    flip_byte(ckpt(run, 6) / "model.safetensors")
    s = train(TrainConfig(**{**cfg, "resume": "auto"}))
    out = capsys.readouterr().out
    assert "skipping step-00000006" in out and "model.safetensors" in out
    assert "resuming from step-00000004" in out
    assert s["step"] == 6 and verify_checkpoint(ckpt(run, 6))
    assert (run / "superseded" / "step-00000006").is_dir()
    after = [r["loss"] for r in read_metrics(run)]
    torch.testing.assert_close(torch.tensor(after), torch.tensor(before), rtol=1e-6, atol=0)


def test_when_no_checkpoint_verifies_the_advice_given_works(run_copy):
    """Every checkpoint damaged: --resume auto said to drop --resume, and without it the folder was refused as
    one holding checkpoints (pass --resume auto): a circle. Its advice now starts the run again."""
    import shutil

    run, cfg = run_copy
    for st, _ in list_checkpoints(run):
        flip_byte(ckpt(run, st) / "model.safetensors")
    with pytest.raises(LcftError, match=r"every checkpoint in .*checkpoints is corrupt; move that folder aside to "
                                        r"start the run again there \(without --resume\), or choose another --out"):
        train(TrainConfig(**{**cfg, "resume": "auto"}))
    shutil.move(run / "checkpoints", run.parent / "checkpoints.corrupt")
    assert train(TrainConfig(**{**cfg, "resume": ""}))["step"] == cfg["steps"]


def test_resume_auto_passes_over_a_checkpoint_without_checksums(run_copy, capsys):
    """A copy cut short (checksums.json and the optimizer state missing): incomplete, said so, step 4 taken."""
    run, cfg = run_copy
    (ckpt(run, 6) / CHECKSUMS).unlink()
    (ckpt(run, 6) / STATE / "optimizer.pt").unlink()
    s = train(TrainConfig(**{**cfg, "resume": "auto", "steps": 7}))
    out = capsys.readouterr().out
    assert "step-00000006 is incomplete: no checksums.json" in out and "resuming from step-00000004" in out
    assert s["step"] == 7



@pytest.mark.parametrize("kind", ["FIFO", "folder"])
def test_a_checksums_json_that_is_no_file_is_refused_not_taken_unverified(run_copy, tmp_path, capsys, kind):
    """A checkpoint whose checksums.json is there but no regular file was verified as a folder without one (a
    transformers folder, taken as it is): `eval -c` and `export` used it unverified. One line naming it now; a
    resume passes over it, saying what it is."""
    run, cfg = run_copy
    listed = plant(ckpt(run, 6) / CHECKSUMS, kind)
    one_line(lambda: resolve_checkpoint(ckpt(run, 6)), str(listed), "not a regular file")
    cli_fails(["export", str(ckpt(run, 6)), "--out", str(tmp_path / "hf")], str(listed))
    cli_fails(["eval", "--data", cfg_data(run), "-c", str(run), "--out", str(tmp_path / "rep"), "--quiet"], str(listed))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "rep").exists()
    assert train(TrainConfig(**{**cfg, "resume": "auto", "steps": 7}))["step"] == 7
    out = " ".join(capsys.readouterr().out.split())
    assert f"skipping step-00000006: {listed} is" in out and "resuming from step-00000004" in out

def test_resume_from_earlier_checkpoint_supersedes_later_ones(run_copy, capsys):
    """--resume step-4 while step-6 is corrupt: the new run owns steps 5-6; the old step-6 is moved aside
    (said so) and the run's step-6 is the new one, complete and verified."""
    run, cfg = run_copy
    (ckpt(run, 6) / STATE / "state.json").write_text("{broken")
    s = train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 4))}))
    assert s["step"] == 6
    assert "moved to" in capsys.readouterr().out
    assert [st for st, _ in list_checkpoints(run)] == [2, 4, 6]
    assert verify_checkpoint(ckpt(run, 6)) and read_trainer_state(ckpt(run, 6))[0].step == 6
    assert (run / "superseded" / "step-00000006" / STATE / "state.json").read_text() == "{broken"


def test_changed_optimizer_options_apply_after_resume(run_copy):
    """--lr/--adam-beta2/--weight-decay changed on resume from step 4: step 5 uses the new peak lr at the
    schedule's position (4 applied updates), and the optimizer holds the new betas and weight decay."""
    run, cfg = run_copy
    s = train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 4)), "lr": 1e-2, "adam_beta2": 0.99,
                             "weight_decay": 0.05}))
    rec = {r["step"]: r for r in read_metrics(run)}
    # cosine after 2 warm-up updates over 6: update 4 is half way, factor 0.1 + 0.9 * 0.5 * (1 + cos(pi/2))
    assert rec[5]["lr"] == pytest.approx(1e-2 * 0.55, rel=1e-12)
    assert rec[4]["lr"] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + 0.5 ** 0.5)), rel=1e-12)  # old trajectory
    _, optim, _, _ = read_trainer_state(s["checkpoint"])
    groups = optim["param_groups"]
    assert [tuple(g["betas"]) for g in groups] == [(0.9, 0.99)] * 2
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]


def test_keep_last_keeps_the_only_verified_checkpoint(run_copy):
    run, _ = run_copy
    flip_byte(ckpt(run, 4) / "model.safetensors")
    (ckpt(run, 6) / STATE / "rng.pt").unlink()
    prune(run, keep_last=2)
    assert [st for st, _ in list_checkpoints(run)] == [2, 4, 6]  # step 2 is the only one that verifies
    prune(run, keep_last=1)
    assert [st for st, _ in list_checkpoints(run)] == [2, 6]


def test_eval_and_export_of_corrupt_checkpoint_name_the_file(run_copy, tmp_path):
    from typer.testing import CliRunner

    from lcft.cli.app import app

    run, _ = run_copy
    flip_byte(ckpt(run, 6) / "model.safetensors")
    with pytest.raises(LcftError, match=f"{ckpt(run, 6) / 'model.safetensors'}.*previous checkpoint is"):
        resolve_checkpoint(run)
    r = CliRunner().invoke(app, ["export", str(ckpt(run, 6)), "--out", str(tmp_path / "hf")])
    assert r.exit_code == 1 and "model.safetensors" in r.output and not (tmp_path / "hf").exists()
    r = CliRunner().invoke(app, ["eval", "--data", cfg_data(run), "--checkpoint", str(run), "--out",
                                 str(tmp_path / "rep"), "--quiet"])
    assert r.exit_code == 1 and "model.safetensors" in " ".join(r.output.split())
    assert not (tmp_path / "rep").exists()


def cfg_data(run: Path) -> str:
    from lcft.config_toml import load_toml

    return load_toml(run / "config.toml")["data"]


def test_existing_step_folder_is_replaced_not_kept(tmp_path):
    """write_checkpoint over an existing step-N (a resumed run recomputing it) replaces it whole."""
    run = tmp_path / "run"
    for content in ("old", "new"):
        write_checkpoint(run, 3, lambda d, c=content: (d / "model.txt").write_text(c), lambda d: None)
    c = ckpt(run, 3)
    assert (c / "model.txt").read_text() == "new" and verify_checkpoint(c)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000003"]


PRUNE = """
import sys
from lcft.checkpoint.save import clean_partial, prune
if sys.argv[2] == "prune":
    prune(sys.argv[1], 1, print)
else:
    clean_partial(sys.argv[1], print)
"""


def test_a_checkpoint_that_cannot_be_pruned_is_a_warning_and_removed_once_it_can(tmp_path):
    """--keep-last 1 over a checkpoint whose files may not be deleted (its folder read-only, for a process
    without root's override): one warning naming the folder left and why, the run's checkpoints pruned; the next
    start says it again; once it may be deleted, the next prune removes it without a word."""
    run = tmp_path / "run"
    for step in (1, 2):
        write_checkpoint(run, step, lambda d: (d / "model.txt").write_text("weights"), lambda d: None)
    left = run / "checkpoints" / ".tmp-pruned-step-00000001"
    ckpt(run, 1).chmod(0o555)
    try:
        pruned = unprivileged([sys.executable, "-c", PRUNE, str(run), "prune"])
        started = unprivileged([sys.executable, "-c", PRUNE, str(run), "start"])
    finally:
        for p in (ckpt(run, 1), left):
            if p.exists():
                p.chmod(0o755)
    assert pruned.returncode == 0 and started.returncode == 0, pruned.stderr + started.stderr
    denied = r"\[Errno 13\] Permission denied: '(checksums.json|model.txt)'"  # the first file rmtree meets
    assert re.fullmatch(f"warning: cannot remove the pruned checkpoint {re.escape(str(left))}: {denied}; its disk "
                        r"space stays in use until it is removed \(each later save and the run's next start try "
                        r"again\)\n", pruned.stdout), pruned.stdout
    assert re.fullmatch(f"warning: cannot remove {re.escape(str(left))}, left by an earlier save or prune: {denied}; "
                        "its disk space stays in use until it is removed\n", started.stdout), started.stdout
    assert sorted(os.listdir(run / "checkpoints")) == [left.name, "step-00000002"]
    assert sorted(os.listdir(left)) == ["checksums.json", "model.txt"]
    write_checkpoint(run, 3, lambda d: (d / "model.txt").write_text("weights"), lambda d: None)
    again = unprivileged([sys.executable, "-c", PRUNE, str(run), "prune"])
    assert again.returncode == 0 and again.stdout == "", again.stderr
    assert os.listdir(run / "checkpoints") == ["step-00000003"]


SAVE = """
import errno, os, sys
from lcft.checkpoint.save import write_checkpoint
from lcft.errors import LcftError

def fail(d):  # a save that fails with its temp folder made undeletable (read-only) on the way
    (d / "model.txt").write_text("half")
    os.chmod(d, 0o555)
    raise OSError(errno.ENOSPC, "No space left on device")

try:
    write_checkpoint(sys.argv[1], 3, fail if sys.argv[2] == "fail" else lambda d: (d / "model.txt").write_text(
        sys.argv[2]), lambda d: None, warn=print)
except LcftError as e:
    print(f"error: {e}")
"""

DENIED = r": \[Errno 13\] Permission denied: '(checksums.json|model.txt)'; its disk space stays in use until it is "


def _save_unprivileged(run: Path, content: str) -> list[str]:
    """write_checkpoint of step 3 (`content` its model.txt, or "fail") without root's override of folder modes;
    its printed lines (warnings, then an error)."""
    try:
        r = unprivileged([sys.executable, "-c", SAVE, str(run), content])
    finally:
        for p in (run / "checkpoints").iterdir():
            p.chmod(0o755)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def test_a_replaced_step_that_cannot_be_deleted_is_a_warning_each_time(tmp_path):
    """Saving step 3 again over a step-3 whose files may not be deleted (read-only): the new copy takes its name
    and one warning names the old copy left and why (it had been removed with errors ignored: its disk space
    kept without a word); saving it again then neither fails on that leftover nor says nothing of the next."""
    run = tmp_path / "run"
    write_checkpoint(run, 3, lambda d: (d / "model.txt").write_text("first"), lambda d: None)
    left = []
    for content in ("second", "third"):
        ckpt(run, 3).chmod(0o555)
        lines = _save_unprivileged(run, content)
        new = sorted(p for p in (run / "checkpoints").glob(".tmp-old-step-00000003-*") if p not in left)
        assert len(new) == 1 and len(lines) == 1, (lines, new)
        left += new
        assert re.fullmatch(f"warning: cannot remove the replaced checkpoint {re.escape(str(new[0]))}{DENIED}"
                            r"removed \(the run's next start tries again\)", lines[0]), lines
        assert (ckpt(run, 3) / "model.txt").read_text() == content and verify_checkpoint(ckpt(run, 3))
    assert [(p / "model.txt").read_text() for p in left] == ["first", "second"]


def test_a_failed_save_whose_temp_folder_stays_says_so(tmp_path):
    """A save that fails (disk full) and whose temp folder cannot be removed: a warning naming it and why before
    the one-line error; the next save over that leftover is one line naming it (had been 'File exists')."""
    run = tmp_path / "run"
    write_checkpoint(run, 2, lambda d: (d / "model.txt").write_text("kept"), lambda d: None)
    tmp = run / "checkpoints" / ".tmp-step-00000003"
    lines = _save_unprivileged(run, "fail")
    assert len(lines) == 2 and re.fullmatch(
        f"warning: cannot remove the failed save's {re.escape(str(tmp))}{DENIED}"
        r"removed \(the run's next start tries again\)", lines[0]), lines
    assert lines[1].startswith("error: cannot save step 3: ") and f"last good checkpoint {ckpt(run, 2)}" in lines[1]
    assert os.listdir(tmp) == ["model.txt"]
    tmp.chmod(0o555)
    lines = _save_unprivileged(run, "new")
    assert lines == [f"error: cannot save step 3: cannot remove {tmp}, left by an earlier save: [Errno 13] "
                     "Permission denied: 'model.txt'"], lines
    assert sorted(os.listdir(run / "checkpoints")) == [tmp.name, "step-00000002"]
