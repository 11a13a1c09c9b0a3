"""Output folders under contention and pressure: one writer per run folder (a live holder named by pid, a
killed one taken over), a full disk during a save or an export, file modes from the umask."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.checkpoint.layout import list_checkpoints, verify_checkpoint
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.folder_lock import LOCK_NAME
from lcft.train import TrainConfig, TrainHooks, train
from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture, by name)

from .launching import RUN

HOLD = """
import sys, time
from lcft.folder_lock import folder_lock
with folder_lock(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    time.sleep(300)
"""


@contextlib.contextmanager
def held(folder: Path, command: str = "lcft train"):
    """Another process holding the folder's lock (as a running `lcft train` does); yields it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), command], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_second_writer_into_a_run_folder_is_refused_naming_the_pid(tmp_path, base_cfg):
    run = tmp_path / "run"
    with held(run) as proc:
        with pytest.raises(LcftError, match=rf"another `lcft train` is writing into {run} \(pid {proc.pid}\)"):
            train(TrainConfig(out=str(run), **base_cfg))
        assert not (run / "config.toml").exists() and not (run / "metrics.jsonl").exists()


def test_lock_of_a_killed_writer_is_taken_over(tmp_path, base_cfg):
    run = tmp_path / "run"
    with held(run) as proc:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (run / LOCK_NAME).read_text().split()[0] == str(proc.pid)  # left behind by kill -9
    s = train(TrainConfig(out=str(run), **base_cfg))
    assert s["step"] == 6 and not (run / LOCK_NAME).exists()


def test_eval_and_export_outputs_are_locked(tmp_path, base_cfg, data_dir, init_dir):
    runner = CliRunner()
    for command, args in (("lcft export", ["export", str(init_dir)]),
                          ("lcft eval", ["eval", "--data", str(data_dir), "--checkpoint", str(init_dir),
                                         "--max-windows", "1", "--quiet"])):
        out = tmp_path / command.split()[1]
        with held(out, command) as proc:
            r = runner.invoke(app, [*args, "--out", str(out)])
            assert r.exit_code == 1, r.output
            assert f"pid {proc.pid}" in " ".join(r.output.split())
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written by the refused command
        r = runner.invoke(app, [*args, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert not (out / LOCK_NAME).exists()


def test_disk_full_during_save_keeps_the_last_good_checkpoint(tmp_path, base_cfg):
    """ENOSPC midway through step 4's checkpoint (raised from the save hook, as the filesystem would): one line
    naming the folder and the space needed, no temp folder left, step 2 intact."""
    run = tmp_path / "run"

    def full(step: int, tmp: Path) -> None:
        if step == 4:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "trainer_state" / "optimizer.pt"))

    with pytest.raises(LcftError) as e:
        train(TrainConfig(out=str(run), **{**base_cfg, "save_every": 2}), TrainHooks(during_save=full))
    msg = str(e.value)
    assert "no space left" in msg and str(run / "checkpoints") in msg and "needs about" in msg
    assert "step-00000002 is kept" in msg and "\n" not in msg
    assert [s for s, _ in list_checkpoints(run)] == [2]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert verify_checkpoint(run / "checkpoints" / "step-00000002")


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_real_full_disk_during_save_and_export(tmp_path, base_cfg):
    """A 1.5 MB tmpfs holds one checkpoint (about 1.06 MB), not two: the save of step 4 fails as above; an
    export onto a 100 KB tmpfs fails with one line and leaves nothing there."""
    with tmpfs(tmp_path / "small", "1500k") as small:
        run = small / "run"
        with pytest.raises(LcftError) as e:
            train(TrainConfig(out=str(run), **{**base_cfg, "save_every": 2}))
        assert "no space left" in str(e.value) and "step-00000002 is kept" in str(e.value)
        assert [s for s, _ in list_checkpoints(run)] == [2]
        assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
        assert verify_checkpoint(run / "checkpoints" / "step-00000002")
        good = tmp_path / "good"
        shutil.copytree(run / "checkpoints" / "step-00000002", good)
    with tmpfs(tmp_path / "tiny", "100k") as tiny:
        r = CliRunner().invoke(app, ["export", str(good), "--out", str(tiny / "hf")])
        assert r.exit_code == 1, r.output
        text = " ".join(r.output.split())
        assert "no space left" in text and "needs about" in text and "Traceback" not in r.output
        assert not (tiny / "hf").exists()


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_outputs_respect_the_umask(tmp_path, base_cfg, mask):
    old = os.umask(mask)
    try:
        s = train(TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "steps": 1}))
        r = CliRunner().invoke(app, ["export", s["checkpoint"], "--out", str(tmp_path / "hf")])
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    for root in (tmp_path / "run", tmp_path / "hf"):
        for p in [root, *root.rglob("*")]:
            want = (0o777 if p.is_dir() else 0o666) & ~mask
            assert stat.S_IMODE(p.stat().st_mode) == want, (p, oct(p.stat().st_mode))


def test_read_only_output_folders_are_one_line(tmp_path, base_cfg, data_dir, init_dir, preloaded):  # noqa: F811
    """`lcft export` and `lcft train` (new, and --resume) into an existing folder that may not be written: one
    line naming it, exit 1, no traceback, nothing changed there."""
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 1}))
    (run / LOCK_NAME).unlink(missing_ok=True)
    ro = tmp_path / "ro"
    ro.mkdir()
    before = sorted(str(p) for p in run.rglob("*"))
    folders = [ro, run, *(p for p in run.rglob("*") if p.is_dir())]
    for f in folders:
        f.chmod(0o555)
    train_args = ["train", "--data", str(data_dir), "--init", str(init_dir), *RUN, "--steps", "2"]
    try:
        for out, args in ((ro, ["export", str(init_dir)]), (ro, train_args),
                          (run, [*train_args, "--resume", "auto"])):
            r = preloaded.run(["-m", "lcft", *args, "--out", str(out)], unprivileged=True)
            lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
            assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
            assert lines[-1] == f"error: cannot write to output folder {out}: Permission denied", lines
    finally:
        for f in folders:
            f.chmod(0o755)
    assert os.listdir(ro) == [] and sorted(str(p) for p in run.rglob("*")) == before
