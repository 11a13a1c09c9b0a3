"""SIGKILL at chosen points of train and export, then the next run of the same command: what the kill left is resumed or
removed, never taken as complete, and no complete output is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from lcft.checkpoint.layout import TMP_PREFIX, list_checkpoints, verify_checkpoint
from lcft.cli.app import app
from lcft.train import TrainConfig, train
from tests.cli.preloaded import Preloaded, preloaded  # noqa: F401  (a fixture, by name)
from tests.train.conftest import base_cfg, data_dir, init_dir  # noqa: F401  (fixtures, by name)

# Train as argv[1] (a JSON TrainConfig) says, SIGKILLed once the first file is removed from the folder of checkpoint
# argv[2] (by its step name or a temp name holding it) once checkpoint argv[3] is saved: midway through pruning.
KILL_IN_PRUNE = textwrap.dedent("""
    import json, os, signal, sys
    from lcft.train import TrainConfig, train
    cfg = json.loads(sys.argv[1])
    victim, saved, real_unlink = sys.argv[2], os.path.join(cfg["out"], "checkpoints", sys.argv[3]), os.unlink
    def unlink(path, *, dir_fd=None):
        folder = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.path.dirname(path)
        real_unlink(path, dir_fd=dir_fd)
        if victim in os.path.basename(folder) and os.path.isdir(saved):
            os.kill(os.getpid(), signal.SIGKILL)
    os.unlink = unlink
    train(TrainConfig(**cfg))
""")

# Train as argv[1] says, every update skipped from step argv[2] on (an infinite loss), SIGKILLed right after a
# complete checkpoint folder is renamed (the first half of a save replacing that checkpoint).
KILL_IN_REPLACE = textwrap.dedent("""
    import json, math, os, re, signal, sys
    from lcft.train import TrainConfig, train
    from lcft.train.trainer import TrainHooks
    real_rename = os.rename
    def rename(src, dst):
        complete = re.fullmatch(r"step-\\d{8}", os.path.basename(src)) and os.path.isfile(f"{src}/checksums.json")
        real_rename(src, dst)
        if complete:
            os.kill(os.getpid(), signal.SIGKILL)
    os.rename = rename
    bad = int(sys.argv[2])
    train(TrainConfig(**json.loads(sys.argv[1])), TrainHooks(perturb_loss=lambda s, loss: loss * math.inf if s >= bad else loss))
""")


def _run(server: Preloaded, script: str, cfg: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    """`python -c SCRIPT CFG ARGS`, forked from the module's preloaded process (its imports done once)."""
    return server.run(["-c", script, json.dumps(cfg), *args], timeout=120)


def _killed(server: Preloaded, script: str, cfg: dict[str, Any], *args: str) -> None:
    proc = _run(server, script, cfg, *args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def _weights(run: Path) -> dict:
    return load_file(str(list_checkpoints(run)[-1][1] / "model.safetensors"))


def test_kill_while_pruning_leaves_no_partly_deleted_checkpoint(preloaded, base_cfg, tmp_path):  # noqa: F811
    """--keep-last 1: SIGKILL while step 1 is deleted after step 2's save. Every step-N folder left verifies
    (a partly deleted step-00000001 stayed under its name: readers found config.toml or the weights missing);
    the next run resumes from step 2, removes the temp folder, and ends where an uninterrupted run does."""
    cfg = {**base_cfg, "steps": 3, "save_every": 1, "keep_last": 1}
    run = tmp_path / "run"
    _killed(preloaded, KILL_IN_PRUNE, {**cfg, "out": str(run)}, "step-00000001", "step-00000002")
    left = list_checkpoints(run)
    assert [s for s, _ in left][-1] == 2, left
    for _, ckpt in left:
        assert verify_checkpoint(ckpt), ckpt
    train(TrainConfig(out=str(run), resume="auto", **cfg))
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(TMP_PREFIX)]
    assert [s for s, _ in list_checkpoints(run)] == [3]
    train(TrainConfig(out=str(tmp_path / "whole"), **cfg))
    ours, whole = _weights(run), _weights(tmp_path / "whole")
    assert ours.keys() == whole.keys() and all(ours[k].equal(whole[k]) for k in ours)


def test_stop_after_skips_at_a_save_step_never_replaces_its_checkpoint(preloaded, base_cfg, tmp_path):  # noqa: F811
    """--save-every 1 --max-consecutive-skips 2, updates skipped from step 3: the run stops at step 4, just saved.
    The stop saved step 4 a second time, replacing the first (renamed aside, then the new one renamed in): a kill
    between the two renames left no step-00000004, and the next start removed both copies as temp folders. Now the
    stop keeps the checkpoint it has: nothing replaces it, and the next run resumes from step 4."""
    cfg = {**base_cfg, "steps": 5, "save_every": 1, "keep_last": 0, "max_consecutive_skips": 2}
    run = tmp_path / "run"
    proc = _run(preloaded, KILL_IN_REPLACE, {**cfg, "out": str(run)}, "3")
    ckpt = run / "checkpoints" / "step-00000004"
    assert verify_checkpoint(ckpt), sorted(p.name for p in ckpt.parent.iterdir())
    assert proc.returncode == 1 and "2 skipped updates in a row" in proc.stderr, proc.stderr[-2000:]
    assert f"checkpoint at {ckpt};" in proc.stderr
    summary = train(TrainConfig(out=str(run), resume="auto", **cfg))
    assert summary["step"] == 5 and [s for s, _ in list_checkpoints(run)] == [1, 2, 3, 4, 5]


# `lcft` with argv[2:], SIGKILLed right after a rename of the export's publishing, as argv[1] says: "first", its
# first move of a file out of the work folder into an existing --out (midway through moving the export in); a
# file's name, its move (config.json, the last: before the empty work folder is removed); "folder", the work
# folder renamed to a new --out (before the hidden sibling that held it is removed).
KILL_IN_EXPORT_MOVE = textwrap.dedent("""
    import os, signal, sys
    from lcft.cli.app import app
    real_replace, point = os.replace, sys.argv[1]
    def replace(src, dst):
        real_replace(src, dst)
        moved = os.path.basename(os.path.dirname(src)) == ".export.tmp" and os.path.dirname(dst) != os.path.dirname(src)
        if (moved and point in ("first", os.path.basename(dst))
                or point == "folder" and os.path.basename(src) == ".export.tmp"):
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    app(sys.argv[2:])
""")


def _export_killed(server: Preloaded, point: str, argv: list[str]) -> None:
    proc = server.run(["-c", KILL_IN_EXPORT_MOVE, point, *argv], timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def _files(folder: Path, hidden: bool = True) -> dict[str, bytes]:
    """{name: bytes} of the files in `folder` (a folder in it fails the read); without `hidden`, those named '.*'
    left out."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if hidden or not p.name.startswith(".")}


def test_readers_of_an_export_killed_midway_say_to_run_it_again(preloaded, init_dir, data_dir, tmp_path):  # noqa: F811
    """`lcft export --force` over an earlier export, SIGKILLed while it moves the new files in (config.json is
    gone until the end): eval, export and train --init given that folder say in one line that an export into it
    was stopped and to run it again (was: not a run, checkpoint or HF model folder); the rerun completes it."""
    out = tmp_path / "hf"
    assert CliRunner().invoke(app, ["export", str(init_dir), "--out", str(out)]).exit_code == 0
    argv = ["export", str(init_dir), "--out", str(out), "--force"]
    _export_killed(preloaded, "first", argv)
    assert not (out / "config.json").exists()
    readers = [["eval", "--data", str(data_dir), "--checkpoint", str(out), "--out", str(tmp_path / "ev")],
               ["export", str(out), "--out", str(tmp_path / "again")],
               ["train", "--data", str(data_dir), "--init", str(out), "--out", str(tmp_path / "run")]]
    for reader in readers:
        r = CliRunner().invoke(app, reader)
        assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, (reader, r.output)
        assert "an `lcft export` into it was stopped midway; run the same export again" in r.output, r.output
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    ours, want = load_file(str(out / "model.safetensors")), load_file(str(init_dir / "model.safetensors"))
    assert ours.keys() == want.keys() and all(ours[k].equal(want[k]) for k in ours)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("point", ["first", "config.json", "folder"])
def test_the_same_export_run_again_after_a_kill_in_its_publishing_completes(preloaded, init_dir,  # noqa: F811
                                                                            tmp_path, point):
    """`lcft export` without --force, SIGKILLed while it moves its files into an empty --out, once config.json is
    in, or once its work folder became the new --out: the same command run again exits 0 with the files of an
    uninterrupted export, byte for byte, and no hidden leftover, beside --out or in it (was: "already exists and is
    not empty (use --force to overwrite)", though readers of the half-moved folder say to run the export again)."""
    (tmp_path / "exports").mkdir()
    out = tmp_path / "exports" / "hf"
    if point != "folder":
        out.mkdir()
    argv = ["export", str(init_dir), "--out", str(out)]
    _export_killed(preloaded, point, argv)
    assert (out / "config.json").is_file() == (point != "first")
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("wrote" if point == "first" else "already exported to"), r.output
    assert CliRunner().invoke(app, ["export", str(init_dir), "--out", str(tmp_path / "whole")]).exit_code == 0
    assert _files(out) == _files(tmp_path / "whole")
    assert os.listdir(tmp_path / "exports") == ["hf"]


@pytest.mark.parametrize("point", ["model.safetensors", "config.json"])
def test_after_a_killed_export_other_files_in_out_are_still_refused(preloaded, init_dir, tmp_path, point):  # noqa: F811
    """What a killed export moved in is taken for its own only by an export that writes each of those files byte
    for byte (decided once built): another one (--dtype bfloat16: other weights) is refused, and so is the same one
    while a file of the user's is beside them; neither changes a file, and the same export run again completes."""
    out = tmp_path / "hf"
    out.mkdir()
    argv = ["export", str(init_dir), "--out", str(out)]
    _export_killed(preloaded, point, argv)
    moved = _files(out, hidden=False)
    r = CliRunner().invoke(app, [*argv, "--dtype", "bfloat16"])
    assert r.exit_code == 1 and "is not this export's (use --force to overwrite)" in r.output, r.output
    assert _files(out, hidden=False) == moved
    (out / "notes.txt").write_text("mine")
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 1 and "its notes.txt is not this export's (use --force to overwrite)" in r.output, r.output
    assert _files(out, hidden=False) == {**moved, "notes.txt": b"mine"}
    (out / "notes.txt").unlink()
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert CliRunner().invoke(app, ["export", str(init_dir), "--out", str(tmp_path / "whole")]).exit_code == 0
    assert _files(out) == _files(tmp_path / "whole")


# Train as argv[1] says, SIGKILLed in step argv[2] (before its update).
KILL_AT_STEP = textwrap.dedent("""
    import json, os, signal, sys
    from lcft.train import TrainConfig, train
    from lcft.train.trainer import TrainHooks
    def perturb(step, loss):
        if step >= int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        return loss
    train(TrainConfig(**json.loads(sys.argv[1])), TrainHooks(perturb_loss=perturb))
""")


def test_a_killed_run_leaves_no_summary_of_an_earlier_one(preloaded, base_cfg, tmp_path):  # noqa: F811
    """A run stopped after 2 steps (summary.json: stop_after at step 2), resumed and SIGKILLed in step 4: no
    summary.json says how it ended (the stopped run's had stayed, read as this run's); the next resume writes
    its own."""
    cfg = {**base_cfg, "steps": 5, "save_every": 1, "out": str(tmp_path / "run")}
    train(TrainConfig(stop_after=2, **cfg))
    summary = tmp_path / "run" / "summary.json"
    assert json.loads(summary.read_text())["stopped"] == "stop_after"
    _killed(preloaded, KILL_AT_STEP, {**cfg, "resume": "auto"}, "4")
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [1, 2, 3] and not summary.exists()
    train(TrainConfig(**{**cfg, "resume": "auto"}))
    assert json.loads(summary.read_text())["step"] == 5
