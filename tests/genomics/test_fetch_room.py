"""`prepare fetch` when its disk fills: a disk filled midway (a real small tmpfs, another writer taking what the
download had been given) is one line naming the folder and what was fetched, the .part kept to resume; a reply of
unknown size (chunked, or ended by the closed connection) stops while the disk still has room, one of known size once
its rest no longer fits; a write that fails after storing part of its bytes is cut back to those written whole
before a resume appends."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lcft.genomics import fetch_http
from lcft.genomics.fetch import fetch_fasta
from tests.genomics import test_fetch
from tests.genomics.conftest import random_genome, write_fasta
from tests.genomics.test_fasta_cache_space import _with_free
from tests.genomics.test_fetch import CHUNK, GenomeServer
from tests.one_line import one_line
from tests.train.test_faults_folders import tmpfs

ROOT = Path(__file__).resolve().parents[2]
source, server = test_fetch.source, test_fetch.server  # the fixtures: a genome, and GenomeServer serving it
RESUMES, STARTS_OVER = "free space and run again; the download resumes", "free space and run again; the download starts over"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@pytest.fixture
def genome(server, tmp_path) -> tuple[str, bytes]:
    """/g/g.fa served (a plain FASTA of about 300 KB: nothing to unpack) and its URL; its bytes."""
    body = write_fasta(tmp_path / "src.fa", {"chrA": random_genome(21, 300_000)}).read_bytes()
    GenomeServer.files["/g/g.fa"] = body
    return server[0].replace("hg38.fa.gz", "g.fa"), body


def _fill(disk: Path, part: Path, held: int) -> None:
    """Another writer that, once the download holds `held` bytes, takes every free byte of `disk`."""
    for _ in range(1000):  # the client writes what it was sent meanwhile: waited for, up to 10 s
        if part.exists() and part.stat().st_size >= held:
            break
        time.sleep(0.01)
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("length", ["sized", "close", "chunked"])
def test_a_disk_filled_midway_is_one_line_and_resumes(genome, tmp_path, length):
    """A 1 MB tmpfs with room for the download when it starts, filled by another writer once half is written: exit
    1 with one line naming the folder and the MiB fetched (it said 'cannot write PART: No space left on device
    (errno 28)'), the .part holding exactly the bytes written and its record, nothing else; the space freed, the
    same command asks for the rest only."""
    url, body = genome
    GenomeServer.length = length
    with tmpfs(tmp_path / "disk", "1m") as disk:
        d, part = disk / "d", disk / "d" / "g.fa.part"
        GenomeServer.midway = {"/g/g.fa": lambda: _fill(disk, part, len(body) // 2)}
        got = subprocess.run([sys.executable, "-m", "lcft", "prepare", "fetch", "g", "--url", url, "--md5", "skip",
                              "--out", str(d)], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                             text=True, timeout=300)
        held = part.stat().st_size
        assert got.returncode == 1 and got.stderr.strip().splitlines()[-1] == (
            f"error: no room left in {d} after {_mib(held)} of {url}: {RESUMES}"), got.stderr[-2000:]
        assert len(body) // 2 <= held < len(body) and part.read_bytes() == body[:held]
        assert sorted(p.name for p in d.iterdir()) == ["g.fa.part", "g.fa.part.json"]
        (disk / "filler").unlink()
        assert fetch_fasta("g", d, url=url, md5="skip", retries=0).read_bytes() == body
    assert GenomeServer.ranges[-1] == f"bytes={held}-"


@pytest.mark.parametrize("length", ["close", "chunked"])
def test_a_download_of_unknown_size_stops_while_the_disk_has_room(genome, tmp_path, monkeypatch, length):
    """A disk of 2 MB (a twentieth, 100 KB, kept free) with 250 KB free, and a reply without a size: the download
    stops before the free space would fall under 100 KB (it went on until the disk was full), one line saying so;
    the space freed, the same command asks for the rest only."""
    url, body = genome
    GenomeServer.length = length
    monkeypatch.setattr(fetch_http, "BLOCK", CHUNK)  # what one read brings: at most 16 KiB
    d, part = tmp_path / "d", tmp_path / "d" / "g.fa.part"
    room, kept = 250_000, 100_000
    _with_free(monkeypatch, tmp_path, lambda: room - (part.stat().st_size if part.exists() else 0), total=2_000_000)
    msg = one_line(lambda: fetch_fasta("g", d, url=url, md5="skip", retries=0))
    held = part.stat().st_size
    assert room - kept - CHUNK < held <= room - kept and part.read_bytes() == body[:held]
    assert msg == (f"no room left in {d} after {_mib(held)} of {url} ({_mib(room - held)} free; a download of unknown "
                   f"size stops short of the last {_mib(kept)}): {RESUMES}")
    room = 10**9
    assert fetch_fasta("g", d, url=url, md5="skip", retries=0).read_bytes() == body
    assert GenomeServer.ranges[-1] == f"bytes={held}-"


@pytest.mark.parametrize("length", ["close", "chunked"])
def test_the_free_space_is_asked_every_so_many_bytes(genome, tmp_path, monkeypatch, length):
    """A reply without a size asks for the free space again after every ROOM_CHECK bytes (here 50 KB, 16 KiB a
    read): not once only (it asked once, before the first byte), nor before each read."""
    url, body = genome
    GenomeServer.length = length
    every = 50_000
    monkeypatch.setattr(fetch_http, "BLOCK", CHUNK)
    monkeypatch.setattr(fetch_http, "ROOM_CHECK", every, raising=False)
    asked = []
    _with_free(monkeypatch, tmp_path, lambda: asked.append(1) or 10**12, total=10**13)
    assert fetch_fasta("g", tmp_path / "d", url=url, md5="skip", retries=0).read_bytes() == body
    # one ask before the first byte (the size none), then one each time up to `every` bytes are written
    assert len(body) // every <= len(asked) - 1 <= len(body) // (every - CHUNK) + 1, len(asked)


def _faulty_writes(monkeypatch: pytest.MonkeyPatch, part: Path, case: str) -> None:
    """The .part's third write fails with ENOSPC after the file grew by half of it, zeros (a filesystem that
    reports a full disk after taking part of a write, its data never stored: a torn tail), or, "unchecked",
    without growing it; "unsynced": its fsync fails too."""
    real_write, writes = os.write, []

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != str(part):
            return real_write(fd, data)
        writes.append(len(data))
        if len(writes) == 3:
            if case != "unchecked":
                real_write(fd, b"\0" * (len(data) // 2))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "write", write)
    if case == "unsynced":
        monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("case", ["torn", "unsynced", "unchecked"])
def test_a_failed_write_is_cut_back_to_what_was_written_whole(genome, tmp_path, monkeypatch, case):
    """A write that fails with ENOSPC after the file grew by bytes it never held: the .part cut back to the bytes
    written whole before it, synced, and resumed from there (a resume appended after the torn tail). Where the
    .part cannot be synced, or nothing checks a resume of it (no validator, no md5), it is removed with its record
    (it held the disk's space in vain), and the same command downloads it again from 0."""
    url, body = genome
    if case == "unchecked":
        GenomeServer.send = frozenset()
    monkeypatch.setattr(fetch_http, "BLOCK", CHUNK)
    d, part = tmp_path / "d", tmp_path / "d" / "g.fa.part"
    _faulty_writes(monkeypatch, part, case)
    msg = one_line(lambda: fetch_fasta("g", d, url=url, md5="skip", retries=0), f"no room left in {d} after ")
    if case == "torn":
        held = part.stat().st_size
        assert 0 < held <= 2 * CHUNK and part.read_bytes() == body[:held]
        assert msg == f"no room left in {d} after {_mib(held)} of {url}: {RESUMES}"
    else:
        assert msg.endswith(STARTS_OVER) and not part.exists() and not fetch_http.record_path(part).exists()
    monkeypatch.undo()
    assert fetch_fasta("g", d, url=url, md5="skip", retries=0).read_bytes() == body
    assert GenomeServer.ranges[-1] == (f"bytes={held}-" if case == "torn" else None)


def test_a_download_of_known_size_stops_once_its_rest_no_longer_fits(genome, tmp_path, monkeypatch):
    """A reply with its size, room for it when it starts, and another writer taking 200 KB once half is written:
    the download stops at its next ask for the free space (every ROOM_CHECK bytes, here 50 KB) with one line saying
    what is free and what is still to come (it asked once, before the first byte, and wrote on until the disk was
    full); the space freed, the same command asks for the rest only."""
    url, body = genome
    monkeypatch.setattr(fetch_http, "BLOCK", CHUNK)
    monkeypatch.setattr(fetch_http, "ROOM_CHECK", 50_000)
    d, part = tmp_path / "d", tmp_path / "d" / "g.fa.part"
    room, taken, half = len(body) + 100_000, 200_000, len(body) // 2

    def free() -> int:
        held = part.stat().st_size if part.exists() else 0
        return room - held - (taken if held >= half else 0)

    _with_free(monkeypatch, tmp_path, free, total=10**9)
    msg = one_line(lambda: fetch_fasta("g", d, url=url, md5="skip", retries=0))
    held = part.stat().st_size
    assert half <= held < half + 50_000 + CHUNK and part.read_bytes() == body[:held]
    assert msg == (f"no room left in {d} after {_mib(held)} of {url} ({_mib(free())} free, {_mib(len(body) - held)} "
                   f"of the file still to come): {RESUMES}")
    room = 10**9
    assert fetch_fasta("g", d, url=url, md5="skip", retries=0).read_bytes() == body
    assert GenomeServer.ranges[-1] == f"bytes={held}-"
