"""lcft.checkpoint.save on file systems that cannot sync or rename a folder: checkpoints are written, named and verified, or the save is one line."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from lcft.checkpoint.layout import list_checkpoints, step_name, verify_checkpoint
from lcft.checkpoint.save import write_checkpoint


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EBADF])
def test_a_file_system_that_cannot_sync_a_folder_still_saves(tmp_path, monkeypatch, err):
    """fsync of a folder's descriptor failing with EINVAL or EBADF (some network and FUSE file systems; files
    sync there): each save is written, renamed and verifies; every save had failed with the OS's error, so no
    run could keep a checkpoint there. Files are still synced, and any other error of a folder's fsync (EIO) is
    still the save's failure."""
    real, synced = os.fsync, []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(err, os.strerror(err))
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = tmp_path / "run"
    for step in (1, 2, 2):  # the second step 2: a resumed run replacing what it recomputed
        write_checkpoint(run, step, lambda d, s=step: (d / "model.txt").write_text(f"step {s}"), lambda d: None)
    assert [s for s, _ in list_checkpoints(run)] == [1, 2] and synced
    assert all(verify_checkpoint(p) for _, p in list_checkpoints(run))

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output error"):
        write_checkpoint(run, 3, lambda d: (d / "model.txt").write_text("step 3"), lambda d: None)
    assert [s for s, _ in list_checkpoints(run)] == [1, 2]


def test_a_file_system_that_will_not_rename_a_folder_is_one_line(tmp_path, monkeypatch):
    """gcsfuse on a flat bucket renames a folder of more files than --rename-dir-limit (0 by default) with EMFILE
    (gcsfuse's internal/fs/fs.go; an empty folder renames): the save is one line naming the folder, the step and
    the limit; the step's earlier checkpoint stays as it was, and no temp folder is left (every save had ended the
    run with a traceback ending in 'Too many open files')."""
    from lcft.errors import LcftError

    run = tmp_path / "run"
    write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("step 1"), lambda d: None)
    real = os.rename

    def gcsfuse(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if os.path.isdir(src) and os.listdir(src):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        real(src, dst)

    monkeypatch.setattr(os, "rename", gcsfuse)
    root = run / "checkpoints"
    for step in (2, 1):  # a new step, and step 1 again (a resumed run replacing what it recomputed)
        with pytest.raises(LcftError) as caught:
            write_checkpoint(run, step, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
        assert str(caught.value) == (
            f"cannot save step {step}: cannot rename the written .tmp-{step_name(step)} to {step_name(step)} in {root}: Too many "
            "open files (errno 24); gcsfuse renames a folder only under its --rename-dir-limit (0 by default), so a "
            "checkpoint needs a bucket with hierarchical namespace or a higher limit")
        assert sorted(p.name for p in root.iterdir()) == [step_name(1)]
    assert (root / step_name(1) / "model.txt").read_text() == "step 1" and verify_checkpoint(root / step_name(1))


def test_a_failed_rename_of_the_new_checkpoint_puts_the_replaced_one_back(tmp_path, monkeypatch):
    """Where only the second rename fails (the old copy already aside), the old copy comes back under its name."""
    from lcft.errors import LcftError

    run = tmp_path / "run"
    write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("step 1"), lambda d: None)
    real = os.rename

    def refuse_temp(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if os.path.basename(src).startswith(".tmp-step-"):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real(src, dst)

    monkeypatch.setattr(os, "rename", refuse_temp)
    with pytest.raises(LcftError, match="Invalid cross-device link"):
        write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [step_name(1)]
    assert (root / step_name(1) / "model.txt").read_text() == "step 1" and verify_checkpoint(root / step_name(1))
