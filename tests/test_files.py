"""lcft.files: atomic replacement keeps the old file on failure and never writes through a link, JSON errors."""

from __future__ import annotations

import os

import pytest

import lcft.files as files
from lcft.errors import LcftError
from lcft.files import atomic_open, atomic_write, read_json


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
