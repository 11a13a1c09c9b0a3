"""A launch whose temporary folder (TMPDIR) is full, or fills while the run goes on: refused before any process
starts, or the job's own outcome all the same (the launcher's spare room takes what the processes hand back), or
one line naming the folder; never a traceback. And the launch leaves nothing of its own in TMPDIR."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lcft import liveness
from lcft.errors import LcftError
from lcft.spare_room import SPARE_ENV, reserve, write_back
from tests.train.conftest import data_dir, init_dir  # noqa: F401 (fixtures)
from tests.train.launching import RUN

HINT = "free space there or set TMPDIR to a writable folder"

# Put first on the workers' PYTHONPATH: TMPDIR's file system is full but for the launcher's spare room, so rank 0's
# summary cannot be handed back until that room is freed (the launcher's own files are written before it fills).
FULL_BUT_THE_SPARE = """
import errno, os
import lcft.files as files
_write = files.atomic_write
def atomic_write(path, *args, **kwargs):
    spare = os.environ.get("LCFT_SPARE")
    if os.path.basename(path) == "result.json" and (spare is None or os.path.exists(spare)):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _write(path, *args, **kwargs)
files.atomic_write = atomic_write
"""


@pytest.mark.distributed
def test_a_temporary_folder_full_after_the_work_keeps_the_outcome(tmp_path, data_dir, init_dir):  # noqa: F811
    """Rank 0 finds TMPDIR full as it hands its summary back: the run is done (exit 0, its summary line), not
    exit 1 with a traceback from each process, and TMPDIR holds nothing of the launch afterwards (torch's agent
    keeps its workers' log folders in the launch's own temporary folder)."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(FULL_BUT_THE_SPARE)
    (tmp_path / "tmp").mkdir()
    path = os.pathsep.join([str(tmp_path / "hook"), str(Path(__file__).resolve().parents[2])])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, TMPDIR=str(tmp_path / "tmp"))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "lcft", "train", "--data", str(data_dir), "--init", str(init_dir),
                        "--out", str(out), *RUN, "--steps", "1", "--nproc", "2"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.startswith("done at step 1/1 "), r.stdout[-3000:]
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor")) == []


def test_a_full_temporary_folder_is_refused_before_the_launch(tmp_path, monkeypatch):
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(LcftError) as e:
        reserve(tmp_path)
    assert str(e.value) == (f"cannot write to the launch's temporary folder {tmp_path} (No space left on device): "
                            f"the workers could not hand back how the run ended; {HINT}")


def test_a_write_back_that_finds_the_folder_full_frees_the_spare_room_once(tmp_path, monkeypatch):
    spare = reserve(tmp_path)
    assert spare.stat().st_blocks * 512 >= 256 * 1024  # allocated, not a sparse promise
    monkeypatch.setenv(SPARE_ENV, str(spare))
    tries = []

    def write() -> str:
        tries.append(spare.exists())
        if spare.exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return "written"

    assert write_back(write) == "written" and tries == [True, False]

    def denied() -> None:  # not a full file system: freeing the room would not help
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    (tmp_path / "again").mkdir()
    spare = reserve(tmp_path / "again")
    monkeypatch.setenv(SPARE_ENV, str(spare))
    with pytest.raises(PermissionError):
        write_back(denied)
    assert spare.exists()


def test_a_diagnosis_the_launchers_folder_cannot_take_is_printed(tmp_path, monkeypatch, capsys):
    """The lowest surviving rank prints it (one line), as with no launcher, instead of a traceback."""
    monkeypatch.setenv(liveness.FAILURE_FILE_ENV, str(tmp_path / "gone" / "failure.txt"))
    liveness.report("rank 1 stopped answering; start it again", True)
    liveness.report("rank 1 stopped answering; start it again", False)
    assert capsys.readouterr().err == "error: rank 1 stopped answering; start it again\n"
