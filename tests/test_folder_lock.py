"""lcft.folder_lock: one writer per output folder, never through a planted link, read-only folders in one line,
the folders made for it removed while empty."""

from __future__ import annotations

import errno
import fcntl
import os
import sys

import pytest

from lcft.errors import LcftError
from lcft.folder_lock import LOCK_NAME, folder_lock
from tests.test_files import _outside
from tests.unprivileged import unprivileged


def test_folder_lock_never_writes_through_a_planted_lock_link(tmp_path):
    victim, out = _outside(tmp_path)
    (out / LOCK_NAME).symlink_to(victim)
    with folder_lock(out, "lcft test"):
        lock = out / LOCK_NAME
        assert not lock.is_symlink() and lock.read_text() == f"{os.getpid()} lcft test\n"
    assert victim.read_text() == "keep me\n"
    assert not (out / LOCK_NAME).exists()


LOCK_READ_ONLY = """
import os, sys
from lcft.errors import LcftError
from lcft.folder_lock import folder_lock
fds = sorted(os.listdir("/proc/self/fd"))
try:
    with folder_lock(sys.argv[1], "lcft test"):
        print("locked")
except LcftError as e:
    print(e)
print("descriptors closed" if sorted(os.listdir("/proc/self/fd")) == fds else "a descriptor left open")
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc")
@pytest.mark.parametrize("stale", [False, True])
def test_read_only_output_folder_is_one_line_and_closes_its_descriptor(tmp_path, stale):
    """An existing folder we may not write (with a killed writer's pid file in it, or not): the same one-line
    error as a read-only parent gives, the folder's descriptor closed, nothing changed."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if stale:
        (ro / LOCK_NAME).write_text("1 lcft train\n")
    ro.chmod(0o555)
    try:
        r = unprivileged([sys.executable, "-c", LOCK_READ_ONLY, str(ro)])
    finally:
        ro.chmod(0o755)
    assert r.stdout.splitlines() == [f"cannot write to output folder {ro}: Permission denied",
                                     "descriptors closed"], r.stderr[-2000:]
    assert os.listdir(ro) == ([LOCK_NAME] if stale else [])


def test_folder_lock_removes_the_empty_parents_it_made_and_no_other(tmp_path):
    """An error in the block: the output folder and the missing parents made for it go while empty; a parent
    that existed before (empty or not) stays, and so does a made one that something else wrote into meanwhile."""
    (tmp_path / "old").mkdir()  # existed before, empty
    with pytest.raises(LcftError, match="refused"), folder_lock(tmp_path / "old/a/b/out", "lcft test"):
        raise LcftError("refused")
    assert sorted(os.listdir(tmp_path)) == ["old"] and os.listdir(tmp_path / "old") == []
    with folder_lock(tmp_path / "c/d/out", "lcft test"):
        (tmp_path / "c/other").write_text("not ours")  # written beside the output during the block
    assert sorted(os.listdir(tmp_path)) == ["c", "old"] and os.listdir(tmp_path / "c") == ["other"]
    with folder_lock(tmp_path / "e/f/out", "lcft test") as out:
        (out / "result").write_text("done")
    assert (tmp_path / "e/f/out/result").read_text() == "done" and os.listdir(tmp_path / "e/f/out") == ["result"]


def test_folders_made_through_a_dotdot_go_too(tmp_path, monkeypatch):
    """`--out new/../out`: new/ is made on the way (mkdir -p makes it) and removed with out/ on an error."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LcftError, match="refused"), folder_lock("new/../out", "lcft test"):
        raise LcftError("refused")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_is_a_warning_and_the_command_runs(tmp_path, monkeypatch, capsys, err):
    """An output folder on a file system whose flock fails (Lustre mounted without -o flock: ENOSYS; NFS without
    its lock daemon: ENOLCK; some FUSE file systems): one warning line naming the folder, and the command writes
    its output (it had stopped with the OS's error: no lcft command ran there). Its pid is still recorded."""
    from lcft.genomics import prepare_windows, verify_windows
    from tests.genomics.conftest import random_genome, write_fasta

    real = fcntl.flock

    def no_locks(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_EX:
            raise OSError(err, os.strerror(err))
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", no_locks)
    fasta = write_fasta(tmp_path / "g.fa", {"chrA": random_genome(1, 5000), "chrB": random_genome(2, 3000)})
    out = tmp_path / "windows"
    prepare_windows(fasta=str(fasta), out=str(out), length=512, train=("chrA",), eval=("chrB",))
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warned == [f"warning: {out} is on a file system that does not lock (flock: {os.strerror(err)}; Lustre "
                      "without -o flock, NFS without lockd): nothing stops a second command writing into it "
                      "meanwhile; run one at a time there"], warned
    verify_windows(str(out))
    with folder_lock(tmp_path / "held", "lcft eval"):
        assert (tmp_path / "held" / LOCK_NAME).read_text() == f"{os.getpid()} lcft eval\n"
