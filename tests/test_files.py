"""lcft.files: atomic replacement keeps the old file on failure and never writes through a link, JSON errors, and
an optional file that is there but no regular file refused (`present`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import lcft.files as files
from lcft.errors import LcftError
from lcft.files import atomic_open, atomic_write, present, read_json
from tests.one_line import one_line


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


# What a handed folder may hold under the name of a file lcft reads when it is there: there, but no regular file
NON_FILES = ["FIFO", "links in a loop", "link to /dev/zero", "folder", "link to nothing"]


def plant(path: Path, kind: str) -> Path:
    """`path` (a file there removed first) made one of NON_FILES."""
    path.unlink(missing_ok=True)
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "links in a loop":
        path.with_name(path.name + ".other").symlink_to(path.name)
        path.symlink_to(path.name + ".other")
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(path.name + ".gone")
    return path


@pytest.mark.parametrize("kind", NON_FILES)
def test_present_refuses_what_is_there_but_no_file(tmp_path, kind):
    path = plant(tmp_path / "lcft.json", kind)
    said = {"FIFO": "is a FIFO", "links in a loop": "is there but cannot be read as a file (Too many levels of symbolic links)",
            "link to /dev/zero": "is a character device", "folder": "is a folder",
            "link to nothing": "is a symbolic link to nothing"}[kind]
    one_line(lambda: present(path, "the record"), f"the record {path} {said}")


def test_present_tells_a_file_from_nothing(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to("f")  # a Hub snapshot's files are links to its blobs
    assert present(tmp_path / "f") and present(tmp_path / "link")
    assert not present(tmp_path / "none") and not present(tmp_path / "f" / "under")


def test_a_bounded_read_asks_for_what_the_file_holds_not_its_bound(tmp_path, monkeypatch):
    """read_text/read_bytes under a bound of 1 GiB: a small file's read reserved the whole bound first (Python sizes
    a read's buffer by what it is asked for: a MemoryError on a node that does not overcommit memory); a /proc file
    (its size says 0) still reads whole; one longer than its size said is read on only up to the bound."""
    import tracemalloc

    small = tmp_path / "small.json"
    small.write_text('{"a": 1}')
    tracemalloc.start()
    try:
        assert files.read_text(small, 1 << 30) == '{"a": 1}'
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert "Name:" in files.read_text("/proc/self/status", 1 << 20)
    grown = tmp_path / "grown"
    grown.write_bytes(b"x" * (3 << 20))
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 0, *real(fd)[7:])))  # "0 bytes"
    one_line(lambda: files.read_bytes(grown, 2 << 20), "grew past the limit of 2097152 bytes")
    assert files.read_bytes(grown, 4 << 20) == b"x" * (3 << 20)
