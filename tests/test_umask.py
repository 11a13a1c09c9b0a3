"""respect_umask where the file system refuses modes: the write goes on, said once per file system."""

from __future__ import annotations

import errno
import os

import pytest

import lcft.umask as umask_module
from lcft.files import atomic_write
from lcft.umask import respect_umask


@pytest.fixture
def refused_modes(monkeypatch):
    """chmod failing as on a file system without modes; returns a setter of the errno it fails with."""
    monkeypatch.setattr(umask_module, "_told", set(), raising=False)  # (a fresh process)
    failing = {"errno": errno.EPERM}

    def refuse(path: str | os.PathLike, mode: int, *args: object, **kwargs: object) -> None:
        raise OSError(failing["errno"], os.strerror(failing["errno"]), str(path))

    monkeypatch.setattr(os, "chmod", refuse)
    return failing


@pytest.mark.parametrize("err", [errno.EPERM, errno.EOPNOTSUPP])
def test_a_file_system_without_modes_is_a_warning_and_the_command_runs(tmp_path, capsys, refused_modes, err):
    """An output folder on a file system whose chmod fails even on a file just made (vfat, exfat: EPERM; a CIFS
    share whose files show as another user's; some FUSE: EOPNOTSUPP): one warning line naming a folder there, and
    the command writes its output (every write had stopped with the OS's error: no lcft command ran there)."""
    from lcft.genomics import prepare_windows, verify_windows
    from tests.genomics.conftest import random_genome, write_fasta

    refused_modes["errno"] = err
    fasta = write_fasta(tmp_path / "g.fa", {"chrA": random_genome(1, 5000), "chrB": random_genome(2, 3000)})
    out = tmp_path / "windows"
    prepare_windows(fasta=str(fasta), out=str(out), length=512, train=("chrA",), eval=("chrB",))
    verify_windows(str(out))
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    # once for the file system: the first folder written there (the FASTA's, for its index) is named
    assert warned == [f"warning: {tmp_path} is on a file system that does not take file modes (chmod: "
                      f"{os.strerror(err)}; vfat or exfat without -o quiet, a CIFS share): what lcft writes there "
                      "keeps the mode it was made with, which may be private to you"], warned


def test_other_chmod_errors_still_fail_the_write(tmp_path, refused_modes):
    """A chmod error that is not a file system's lack of modes (here EIO) stops the write, nothing left behind."""
    refused_modes["errno"] = errno.EIO
    with pytest.raises(OSError) as caught:
        atomic_write(tmp_path / "a.json", "{}")
    assert caught.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_respect_umask_gives_the_umask_mode(tmp_path):
    """The mode a plain open would give, where the file system takes modes."""
    f = tmp_path / "f"
    f.touch(mode=0o600)
    old = os.umask(0o027)
    try:
        respect_umask(f, folder=False)
    finally:
        os.umask(old)
    assert f.stat().st_mode & 0o777 == 0o640
