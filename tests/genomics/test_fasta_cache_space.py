"""Decompressing a plain gzip FASTA (into the cache, or a fetch's download into its folder) checks the free space
there against the size gzip's trailer gives before writing; the free space is patched, so no disk is filled."""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from lcft.errors import LcftError
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_cache import cache_dir
from lcft.genomics.fetch import fetch_fasta
from tests.genomics.conftest import random_genome, write_fasta
from tests.genomics.test_fetch import GenomeServer


def _with_free(monkeypatch: pytest.MonkeyPatch, folder: Path, free: int | Callable[[], int],
               total: int | None = None) -> None:
    """The filesystem of `folder` (and of what is under it) reports `free` bytes free (or what `free()` says each
    time it is asked), and a size of `total` where given; others as they are."""
    real = shutil.disk_usage

    def usage(path: str | Path) -> tuple[int, int, int]:
        got = real(path)
        if not Path(path).is_relative_to(folder):
            return got
        return got._replace(free=free() if callable(free) else free, total=got.total if total is None else total)

    monkeypatch.setattr(shutil, "disk_usage", usage)


@pytest.fixture
def genome(tmp_path: Path) -> tuple[Path, bytes]:
    fa = write_fasta(tmp_path / "src.fa", {"chrA": random_genome(3, 200_000), "chrB": random_genome(4, 50_000)})
    return fa, fa.read_bytes()


@pytest.mark.parametrize("gap", [-1, 0])
def test_a_cache_without_room_for_the_copy_is_one_line_before_writing(tmp_path, monkeypatch, genome, gap):
    """Free space one byte under the decompressed size: refused in one line naming both, and the cache holds no
    copy nor temp file (the copy was written until the disk was full); exactly the size: the copy is made."""
    _, plain = genome
    gz = tmp_path / "g.fa.gz"
    gz.write_bytes(gzip.compress(plain, mtime=0))
    _with_free(monkeypatch, cache_dir(), len(plain) + gap)
    if gap < 0:
        with pytest.raises(LcftError) as e:
            FastaFile(gz)
        assert str(e.value) == (f"no space left on the device of {cache_dir() / 'fasta'}: decompressing {gz} (at least "
                                "the size its gzip trailer and length allow, which a cut or damaged file gives wrong) "
                                "needs at least "
                                f"{len(plain) / 2**20:.1f} MiB, "
                                f"{(len(plain) - 1) / 2**20:.1f} MiB free")
        digest = hashlib.sha256(gz.read_bytes()).hexdigest()[:32]
        assert not [p for p in (cache_dir() / "fasta").iterdir() if digest in p.name]
    else:
        with FastaFile(gz) as f:
            assert f.readable.read_bytes() == plain


def test_the_trailer_size_is_a_floor(tmp_path, monkeypatch, genome):
    """Zero padding after the trailer, or a second member, only lowers the size read: room for the whole copy is
    never refused (here two members, padded: the free space equals the whole decompressed size)."""
    _, plain = genome
    gz = tmp_path / "two.fa.gz"
    gz.write_bytes(gzip.compress(plain[:100_000], mtime=0) + gzip.compress(plain[100_000:], mtime=0) + b"\0" * 3)
    _with_free(monkeypatch, cache_dir(), len(plain))
    with FastaFile(gz) as f:
        assert f.readable.read_bytes() == plain


def test_a_fetch_without_room_to_unpack_keeps_the_download(tmp_path, monkeypatch, genome):
    """The download checked, its folder short of room for hg38.fa: one line, the download kept; given room, the
    same command unpacks it without downloading again."""
    _, plain = genome
    body = gzip.compress(plain, mtime=0)
    GenomeServer.files = {"/g/hg38.fa.gz": body,
                          "/g/md5sum.txt": f"{hashlib.md5(body).hexdigest()}  hg38.fa.gz\n".encode()}
    GenomeServer.cut, GenomeServer.ranges, GenomeServer.honour_range = set(), [], True
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), GenomeServer)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url, d = f"http://127.0.0.1:{httpd.server_address[1]}/g/hg38.fa.gz", tmp_path / "d"
    try:
        _with_free(monkeypatch, d, len(plain) - 1)
        with pytest.raises(LcftError, match=re.escape(f"no space left on the device of {d}: decompressing {d}/")):
            fetch_fasta("hg38", d, url=url)
        assert sorted(p.name for p in d.iterdir()) == ["hg38.fa.gz"]
        monkeypatch.undo()
        n = len(GenomeServer.ranges)
        assert fetch_fasta("hg38", d, url=url).read_bytes() == plain and len(GenomeServer.ranges) == n
    finally:
        httpd.shutdown()
        httpd.server_close()
