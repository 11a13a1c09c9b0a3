"""lcft.files: atomic replacement keeps the old file on failure, chunked hashes equal hashlib's, JSON errors."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

import lcft.files as files
from lcft.errors import LcftError
from lcft.files import atomic_open, atomic_write, file_hash, read_json


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "a.txt"
    atomic_write(p, "old\n")
    atomic_write(p, b"new\n", fsync=True)
    assert p.read_bytes() == b"new\n"
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_failure_midway_keeps_the_old_file(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("complete")
    with pytest.raises(RuntimeError), atomic_open(p, "w") as fh:
        fh.write("half")
        raise RuntimeError("killed")
    assert p.read_text() == "complete"
    assert sorted(os.listdir(tmp_path)) == ["a.json"]


def test_a_writer_may_close_the_handle_itself(tmp_path):
    p = tmp_path / "b.bin"
    with atomic_open(p, "wb") as fh:
        fh.write(b"xyz")
        fh.close()  # as Bio's BgzfWriter does with a file object it was given
    assert p.read_bytes() == b"xyz"


@pytest.mark.parametrize("algorithm", ["sha256", "md5"])
def test_file_hash_matches_hashlib_across_chunks(tmp_path, monkeypatch, algorithm):
    data = os.urandom(1000)
    p = tmp_path / "d"
    p.write_bytes(data)
    monkeypatch.setattr(files, "HASH_CHUNK", 7)  # many reads, the last one short
    assert file_hash(p, algorithm).hexdigest() == hashlib.new(algorithm, data).hexdigest()
    assert file_hash(p, algorithm, upto=333).hexdigest() == hashlib.new(algorithm, data[:333]).hexdigest()
    assert file_hash(p, algorithm, upto=0).hexdigest() == hashlib.new(algorithm).hexdigest()


def test_read_json_errors_name_the_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}')
    assert read_json(p) == {"a": 1}
    for text, message in (("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")):
        p.write_text(text)
        with pytest.raises(LcftError, match=message) as e:
            read_json(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(LcftError, match="cannot read"):
        read_json(tmp_path / "missing.json")


def test_read_json_takes_regular_files_of_bounded_size(tmp_path, monkeypatch):
    """Every JSON lcft is handed (config.json, lcft.json, a windows manifest, an index) goes through read_json: a
    FIFO in a file's place blocked it for ever, and a file of any size was read whole."""
    import signal

    os.mkfifo(tmp_path / "fifo.json")

    def stuck(*_):
        raise TimeoutError("read_json blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        with pytest.raises(LcftError, match=r"fifo.json is not a regular file$"):
            read_json(tmp_path / "fifo.json")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    big = tmp_path / "big.json"
    big.write_text('{"a": "' + "x" * 100 + '"}')
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 64)
    with pytest.raises(LcftError, match=r"big.json is 109 bytes, over the limit of 64$"):
        read_json(big)


def test_files_sha256_is_the_name_ordered_digest_of_names_and_file_hashes(tmp_path):
    import hashlib

    from lcft.files import files_sha256

    a, b = tmp_path / "b.bin", tmp_path / "a.bin"
    a.write_bytes(b"second"), b.write_bytes(b"first")
    want = hashlib.sha256()
    for f in (b, a):  # name order: a.bin, b.bin
        want.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).hexdigest().encode())
    assert files_sha256([a, b]) == want.hexdigest()


def _outside(tmp_path):
    """A file outside the output folder, and the folder."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    return victim, out


def test_atomic_write_never_writes_through_a_planted_temp_link(tmp_path):
    victim, out = _outside(tmp_path)
    (out / ".a.json.tmp").symlink_to(victim)
    atomic_write(out / "a.json", "{}\n")
    assert victim.read_text() == "keep me\n"
    assert (out / "a.json").read_text() == "{}\n" and not (out / "a.json").is_symlink()
    assert sorted(os.listdir(out)) == ["a.json"]


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim, out = _outside(tmp_path)
    (out / "a.json").symlink_to(victim)
    atomic_write(out / "a.json", "{}\n")
    assert victim.read_text() == "keep me\n" and not (out / "a.json").is_symlink()


def test_folder_lock_never_writes_through_a_planted_lock_link(tmp_path):
    victim, out = _outside(tmp_path)
    (out / files.LOCK_NAME).symlink_to(victim)
    with files.folder_lock(out, "lcft test"):
        lock = out / files.LOCK_NAME
        assert not lock.is_symlink() and lock.read_text() == f"{os.getpid()} lcft test\n"
    assert victim.read_text() == "keep me\n"
    assert not (out / files.LOCK_NAME).exists()


# Root may write into any folder whatever its mode: the child runs without the capabilities that allow it (as
# an ordinary user would), so a read-only folder refuses it.
UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--inh-caps=-all"]


def unprivileged(args: list[str]) -> subprocess.CompletedProcess:
    """`args` run where folder modes apply: as root through setpriv (skipped without it), else as is."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to run without root's override of folder modes")
        prefix = UNPRIVILEGED
    r = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=600)
    if r.stderr.startswith("setpriv:"):
        pytest.skip(f"setpriv cannot drop capabilities here ({r.stderr.strip()})")
    return r


LOCK_READ_ONLY = """
import os, sys
from lcft.errors import LcftError
from lcft.files import folder_lock
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
        (ro / files.LOCK_NAME).write_text("1 lcft train\n")
    ro.chmod(0o555)
    try:
        r = unprivileged([sys.executable, "-c", LOCK_READ_ONLY, str(ro)])
    finally:
        ro.chmod(0o755)
    assert r.stdout.splitlines() == [f"cannot write to output folder {ro}: Permission denied",
                                     "descriptors closed"], r.stderr[-2000:]
    assert os.listdir(ro) == ([files.LOCK_NAME] if stale else [])


def test_folder_lock_removes_the_empty_parents_it_made_and_no_other(tmp_path):
    """An error in the block: the output folder and the missing parents made for it go while empty; a parent
    that existed before (empty or not) stays, and so does a made one that something else wrote into meanwhile."""
    (tmp_path / "old").mkdir()  # existed before, empty
    with pytest.raises(LcftError, match="refused"), files.folder_lock(tmp_path / "old/a/b/out", "lcft test"):
        raise LcftError("refused")
    assert sorted(os.listdir(tmp_path)) == ["old"] and os.listdir(tmp_path / "old") == []
    with files.folder_lock(tmp_path / "c/d/out", "lcft test"):
        (tmp_path / "c/other").write_text("not ours")  # written beside the output during the block
    assert sorted(os.listdir(tmp_path)) == ["c", "old"] and os.listdir(tmp_path / "c") == ["other"]
    with files.folder_lock(tmp_path / "e/f/out", "lcft test") as out:
        (out / "result").write_text("done")
    assert (tmp_path / "e/f/out/result").read_text() == "done" and os.listdir(tmp_path / "e/f/out") == ["result"]


def test_folders_made_through_a_dotdot_go_too(tmp_path, monkeypatch):
    """`--out new/../out`: new/ is made on the way (mkdir -p makes it) and removed with out/ on an error."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LcftError, match="refused"), files.folder_lock("new/../out", "lcft test"):
        raise LcftError("refused")
    assert os.listdir(tmp_path) == []


def test_a_file_to_resume_is_opened_only_when_it_is_ours_alone(tmp_path):
    """open_own: a regular file of one name opens; a symlink, a second (hard) name of another file, a folder and a
    FIFO do not, and nothing is read or written through them."""
    own = tmp_path / "own"
    own.write_bytes(b"kept")
    with files.open_own(own) as fh:
        assert fh.read() == b"kept"
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's")
    (tmp_path / "soft").symlink_to(victim)
    os.link(victim, tmp_path / "hard")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name in ("soft", "hard", "fifo", "folder", "missing"):
        assert files.open_own(tmp_path / name) is None, name
    assert victim.read_bytes() == b"someone else's"
    assert [files.not_own(tmp_path / n) for n in ("own", "soft", "hard", "fifo", "folder", "missing")] == [
        False, True, False, True, True, False]
    assert files.not_own(tmp_path / "folder", folder=True) is False and files.not_own(own, folder=True) is True


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
        files.refuse_foreign(work, "tool")
    else:
        with pytest.raises(LcftError) as e:
            files.refuse_foreign(work, "tool")
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
        files.refuse_not_own(tmp_path / name, "tool", folder=folder)
    what = "a folder tool made (a link or a file)" if folder else "a file tool wrote (a link, a folder or a FIFO)"
    for name in ("link", "dangling", "fifo", other):
        with pytest.raises(LcftError) as e:
            files.refuse_not_own(tmp_path / name, "tool", folder=folder)
        assert str(e.value) == f"{tmp_path / name} is not {what}; remove it and re-run"
    assert sorted((p.name, p.lstat().st_mode) for p in tmp_path.rglob("*")) == before
    assert (victim / "theirs").read_text() == "keep"
