"""lcft.checkpoint.save on file systems that cannot sync a folder: checkpoints are written, named and verified."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from lcft.checkpoint.layout import list_checkpoints, verify_checkpoint
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
