"""lcft.foreign_entries: a file to resume opens only when it is ours alone; a link, folder or FIFO where lcft
keeps its files is refused in one line, nothing changed."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from lcft.errors import LcftError
from lcft.foreign_entries import not_own, open_own, refuse_foreign, refuse_not_own, resume_own
from tests.unprivileged import unprivileged


def test_a_file_to_resume_is_opened_only_when_it_is_ours_alone(tmp_path):
    """open_own: a regular file of one name opens; a symlink, a second (hard) name of another file, a folder and a
    FIFO do not, and nothing is read or written through them."""
    own = tmp_path / "own"
    own.write_bytes(b"kept")
    with open_own(own) as fh:
        assert fh.read() == b"kept"
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's")
    (tmp_path / "soft").symlink_to(victim)
    os.link(victim, tmp_path / "hard")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name in ("soft", "hard", "fifo", "folder", "missing"):
        assert open_own(tmp_path / name) is None, name
    assert victim.read_bytes() == b"someone else's"
    assert [not_own(tmp_path / n) for n in ("own", "soft", "hard", "fifo", "folder", "missing")] == [
        False, True, False, True, True, False]
    assert not_own(tmp_path / "folder", folder=True) is False and not_own(own, folder=True) is True


def test_a_file_to_resume_that_cannot_be_opened_says_why(tmp_path):
    """resume_own: a second (hard) name is refused as one; a file of one name this user may not read and write
    (mode 0: another owner's) says the OS's reason (it was called a hard link), and is left as it was."""
    (tmp_path / "victim").write_bytes(b"someone else's")
    os.link(tmp_path / "victim", tmp_path / "hard")
    with pytest.raises(LcftError, match=r"hard\) name|a second name of another file \(a hard link\)"):
        resume_own(tmp_path / "hard", "eval")
    locked = tmp_path / "locked"
    locked.write_bytes(b"kept")
    locked.chmod(0)
    tmp_path.chmod(0o777)
    r = unprivileged([sys.executable, "-c", "from pathlib import Path\nfrom lcft.errors import LcftError\n"
                      "from lcft.foreign_entries import resume_own\n"
                      f"try: resume_own(Path({str(locked)!r}), 'eval')\n"
                      "except LcftError as e: raise SystemExit(f'error: {e}')"])
    assert r.returncode == 1 and r.stderr.strip() == (
        f"error: {locked}: cannot open it to resume eval (Permission denied); make it readable and writable, or "
        "remove it and re-run"), r.stderr[-2000:]
    assert locked.stat().st_mode & 0o777 == 0


@pytest.mark.parametrize("planted", ["link", "dangling", "folder", "fifo", "partial_link", "partial_file", None])
def test_refuse_foreign_names_what_is_not_ours_and_changes_nothing(tmp_path, planted):
    """A work folder of regular files only: the first link, folder or FIFO in it (or the folder itself a link or a
    file) is named in one line with the command's name; a folder of regular files passes; nothing is removed."""
    work, victim = tmp_path / "work", tmp_path / "victim"
    victim.mkdir()
    (victim / "theirs").write_text("keep")
    work.mkdir()
    (work / "a.bin").write_bytes(b"ours")
    named = {"link": work / "b.bin", "dangling": work / "b.bin", "folder": work / "b.bin", "fifo": work / "b.bin",
             "partial_link": work, "partial_file": work}.get(planted)
    if planted in ("link", "dangling"):
        named.symlink_to(victim / ("theirs" if planted == "link" else "gone"))
    elif planted == "folder":
        named.mkdir()
        (named / "inside").write_text("keep")
    elif planted == "fifo":
        os.mkfifo(named)
    elif planted == "partial_link":
        shutil.rmtree(work)
        work.symlink_to(victim)
    elif planted == "partial_file":
        shutil.rmtree(work)
        work.write_text("keep")
    before = sorted((p.name, p.lstat().st_mode) for p in tmp_path.rglob("*"))
    if named is None:
        refuse_foreign(work, "tool")
    else:
        with pytest.raises(LcftError) as e:
            refuse_foreign(work, "tool")
        assert str(e.value) == (f"{work} is not a folder tool made (a link or a file); remove it and re-run"
                                if named == work else f"{named} is not a file tool wrote (a link, a folder or a "
                                f"FIFO); remove it, or the whole {work}, and re-run")
    assert sorted((p.name, p.lstat().st_mode) for p in tmp_path.rglob("*")) == before
    assert (victim / "theirs").read_text() == "keep"


@pytest.mark.parametrize("folder", [False, True])
def test_a_named_file_or_folder_not_ours_is_one_line_in_the_same_words(tmp_path, folder):
    """refuse_not_own: under a name where a command keeps one regular file (or folder), a link (dangling or not), a
    FIFO, or a folder (a file) is named in refuse_foreign's words, the whole folder not offered; a file (a folder)
    of its own and nothing there pass; nothing is changed."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "theirs").write_text("keep")
    (tmp_path / "link").symlink_to(victim if folder else victim / "theirs")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("keep")
    (tmp_path / "dir").mkdir()
    before = sorted((p.name, p.lstat().st_mode) for p in tmp_path.rglob("*"))
    own, other = ("dir", "file") if folder else ("file", "dir")
    for name in (own, "missing"):
        refuse_not_own(tmp_path / name, "tool", folder=folder)
    what = "a folder tool made (a link or a file)" if folder else "a file tool wrote (a link, a folder or a FIFO)"
    for name in ("link", "dangling", "fifo", other):
        with pytest.raises(LcftError) as e:
            refuse_not_own(tmp_path / name, "tool", folder=folder)
        assert str(e.value) == f"{tmp_path / name} is not {what}; remove it and re-run"
    assert sorted((p.name, p.lstat().st_mode) for p in tmp_path.rglob("*")) == before
    assert (victim / "theirs").read_text() == "keep"
