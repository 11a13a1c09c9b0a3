"""`fetch_fasta` against a local HTTP server on 127.0.0.1: Range resume, md5 check, gzip -> pyfaidx-ready."""

from __future__ import annotations

import gzip
import hashlib
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lcft.errors import RESUME, LcftError
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_check import gzip_kind
from lcft.genomics.fetch import MD5_LIST_LIMIT, fetch_fasta
from tests.genomics.conftest import random_genome, write_fasta
from tests.one_line import one_line

STALL_S = 2.0  # how long a stalled transfer sends nothing: past the 0.5 s timeout its test gives the client
CHUNK = 1 << 14  # the bytes of each chunk of a chunked reply


class GenomeServer(BaseHTTPRequestHandler):
    """Serves `files`, each with the validators named in `send` (an ETag and a Last-Modified of its content);
    honours 'Range: bytes=N-', and 'If-Range' unless `if_range` is off (a mismatch: the whole file); the first GET
    of a path in `cut` sends half the body (with the full Content-Length) and drops the connection, like a broken
    transfer; of a path in `stall`, a quarter of it, then nothing for STALL_S (a stalled link: the client's
    timeout comes first). A range is sent from `shift` bytes before the one asked (a server answering another).
    `length`: "sized" sends Content-Length; "close" none, the end of the body the closed connection (HTTP/1.0);
    "chunked" none, the body in CHUNK-byte chunks (HTTP/1.1). A path in `midway` has its callable run once half the
    body is sent (another process at work meanwhile)."""

    files: dict[str, bytes] = {}
    cut: set[str] = set()
    stall: set[str] = set()
    fail: dict[str, int] = {}  # a path answered with this HTTP status, every time
    ranges: list[str | None] = []
    if_ranges: list[str | None] = []
    honour_range = True
    send: frozenset[str] = frozenset({"ETag", "Last-Modified"})
    if_range = True
    shift = 0
    length = "sized"
    midway: dict[str, Callable[[], object]] = {}

    @classmethod
    def validators(cls, body: bytes) -> dict[str, str]:
        """What a server says identifies this version of a file, of those named in `send`."""
        tag = hashlib.md5(body).hexdigest()
        every = {"ETag": f'"{tag[:16]}"', "Last-Modified": formatdate(1.6e9 + int(tag[:6], 16), usegmt=True)}
        return {k: v for k, v in every.items() if k in cls.send}

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.files.get(self.path)
        if body is None or self.path in self.fail:
            self.ranges.append(self.headers.get("Range"))
            self.send_error(self.fail.get(self.path, 404))
            return
        rng, tag = self.headers.get("Range"), self.headers.get("If-Range")
        self.ranges.append(rng)
        self.if_ranges.append(tag)
        start = int(rng.split("=")[1].rstrip("-")) if rng and self.honour_range else 0
        if tag is not None and self.if_range and tag not in self.validators(body).values():
            start = 0  # another version of the file than the client's: all of it
        if start >= len(body) and start:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.end_headers()
            return
        if self.length == "chunked":
            self.protocol_version = "HTTP/1.1"  # (chunked replies are HTTP/1.1's; send_response reads it)
            self.close_connection = True
        self.send_response(206 if start else 200)
        if start:
            start = max(0, start - self.shift)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        for name, value in self.validators(body).items():
            self.send_header(name, value)
        if self.length == "sized":
            self.send_header("Content-Length", str(len(body) - start))
        elif self.length == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.path in self.stall:
            self.stall.discard(self.path)
            self.wfile.write(body[start : start + (len(body) - start) // 4])
            self.wfile.flush()
            time.sleep(STALL_S)
            self.close_connection = True
            return
        if self.path in self.cut:
            self.cut.discard(self.path)
            self.wfile.write(body[start : start + (len(body) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if (then := self.midway.pop(self.path, None)) is not None:
            half = start + (len(body) - start) // 2
            self._body(body[start:half], end=False)
            then()
            start = half
        self._body(body[start:])

    def _body(self, data: bytes, end: bool = True) -> None:
        """Send `data`, as chunks when `length` says so (the last chunk, of 0 bytes, when `end`)."""
        if self.length != "chunked":
            self.wfile.write(data)
        else:
            for i in range(0, len(data), CHUNK):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(data[i:i + CHUNK]), data[i:i + CHUNK]))
            if end:
                self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[bytes, bytes]:
    d = tmp_path_factory.mktemp("src")
    fa = write_fasta(d / "src.fa", {"chrA": random_genome(5, 300_000), "chrB": random_genome(6, 120_000)})
    return fa.read_bytes(), gzip.compress(fa.read_bytes(), compresslevel=1, mtime=0)


@pytest.fixture
def server(source):
    plain, gz = source
    GenomeServer.files = {
        "/g/hg38.fa.gz": gz,
        "/g/md5sum.txt": f"{hashlib.md5(gz).hexdigest()}  hg38.fa.gz\n0123  other.fa.gz\n".encode(),
    }
    GenomeServer.cut, GenomeServer.stall, GenomeServer.ranges, GenomeServer.honour_range = set(), set(), [], True
    GenomeServer.fail, GenomeServer.if_ranges, GenomeServer.if_range, GenomeServer.shift = {}, [], True, 0
    GenomeServer.send, GenomeServer.length, GenomeServer.midway = frozenset({"ETag", "Last-Modified"}), "sized", {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), GenomeServer)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/g/hg38.fa.gz", plain
    httpd.shutdown()
    httpd.server_close()


def _records(path) -> dict[str, str]:
    with FastaFile(path) as f:
        return {n: f.read_raw(n, 0, f.length(n)).decode().replace("\n", "") for n in f.names}


def test_interrupted_transfer_resumes_in_the_same_call(server, tmp_path):
    url, plain = server
    GenomeServer.cut = {"/g/hg38.fa.gz"}
    ready = fetch_fasta("hg38", tmp_path / "d", url=url, retries=2)
    gz_size = len(GenomeServer.files["/g/hg38.fa.gz"])
    assert f"bytes={gz_size // 2}-" in GenomeServer.ranges, GenomeServer.ranges
    assert ready.name == "hg38.fa" and ready.read_bytes() == plain
    assert (tmp_path / "d" / "hg38.fa.fai").is_file()
    assert not list((tmp_path / "d").glob("*.part"))


def test_interrupted_transfer_resumes_on_rerun(server, tmp_path):
    url, plain = server
    GenomeServer.cut = {"/g/hg38.fa.gz"}
    with pytest.raises(LcftError, match="interrupted after .*; " + RESUME):
        fetch_fasta("hg38", tmp_path / "d", url=url, retries=0)
    part = tmp_path / "d" / "hg38.fa.gz.part"
    assert 0 < part.stat().st_size < len(GenomeServer.files["/g/hg38.fa.gz"])
    assert not (tmp_path / "d" / "hg38.fa.gz").exists()
    have = part.stat().st_size
    ready = fetch_fasta("hg38", tmp_path / "d", url=url, retries=0)
    assert GenomeServer.ranges[-1] == f"bytes={have}-"
    assert ready.read_bytes() == plain


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    """A 200 to a Range request is the whole file: written from 0, not appended (no md5 to catch it)."""
    url, plain = server
    GenomeServer.cut, GenomeServer.honour_range = {"/g/hg38.fa.gz"}, False
    assert fetch_fasta("hg38", tmp_path / "d", url=url, md5="skip", retries=1).read_bytes() == plain
    assert GenomeServer.ranges[-1] is not None  # the second try asked for the rest


def test_md5_mismatch_is_an_error_and_leaves_nothing(server, tmp_path):
    """Nor the folders made for the download (had left new/ and new/d/)."""
    url, _ = server
    with pytest.raises(LcftError, match="md5 mismatch.*, given by --md5 0{32};"):  # not "published": the user's
        fetch_fasta("hg38", tmp_path / "new" / "d", url=url, md5="0" * 32)
    assert list(tmp_path.iterdir()) == []


def test_missing_published_md5_is_an_error(server, tmp_path):
    url, _ = server
    (tmp_path / "d").mkdir()  # there before: kept
    with pytest.raises(LcftError, match="--md5"):
        fetch_fasta("x", tmp_path / "d" / "new", url=url.replace("hg38.fa.gz", "other2.fa.gz"))
    with pytest.raises(LcftError, match="HTTP 404"):
        fetch_fasta("x", tmp_path / "d" / "new", url=url.replace("hg38.fa.gz", "other2.fa.gz"), md5="skip")
    assert list(tmp_path.iterdir()) == [tmp_path / "d"] and list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("extra", [0, 1])
def test_an_md5_list_over_the_limit_is_refused_unread(server, tmp_path, extra):
    """md5sum.txt is held in memory: one of MD5_LIST_LIMIT bytes is read (its md5 line last), one byte more is
    refused in one line and nothing is downloaded (a server sending without end had it read into memory whole)."""
    url, plain = server
    line = GenomeServer.files["/g/md5sum.txt"].split(b"\n")[0] + b"\n"
    GenomeServer.files["/g/md5sum.txt"] = b"\n" * (MD5_LIST_LIMIT - len(line) + extra) + line
    assert len(GenomeServer.files["/g/md5sum.txt"]) == MD5_LIST_LIMIT + extra
    if extra:
        with pytest.raises(LcftError) as e:
            fetch_fasta("hg38", tmp_path / "d", url=url)
        assert str(e.value) == (f"{url.replace('hg38.fa.gz', 'md5sum.txt')} is over 1 MiB: not an md5 list; "
                                "pass --md5 HEX or --md5 skip")
        assert GenomeServer.ranges == [None] and not tmp_path.joinpath("d").exists()  # only the list asked for
    else:
        assert fetch_fasta("hg38", tmp_path / "d", url=url).read_bytes() == plain


def test_bgzip_option_gives_random_access_gzip(server, tmp_path):
    """--bgzip: the download hg38.fa.gz recompressed as BGZF in its place (it wrote hg38.fa.bgz.gz beside it)."""
    url, plain = server
    d = tmp_path / "d"
    ready = fetch_fasta("hg38", d, url=url, bgzip=True)
    assert ready == d / "hg38.fa.gz" and sorted(p.name for p in d.iterdir()) == [
        "hg38.fa.gz", "hg38.fa.gz.fai", "hg38.fa.gz.gzi"]
    assert gzip_kind(ready) == "bgzf" and gzip.decompress(ready.read_bytes()) == plain
    (tmp_path / "plain.fa").write_bytes(plain)
    assert _records(ready) == _records(tmp_path / "plain.fa")
    n, stamp = len(GenomeServer.ranges), ready.stat().st_mtime_ns
    assert fetch_fasta("hg38", d, url=url, bgzip=True) == ready  # no download, no recompression
    assert len(GenomeServer.ranges) == n and ready.stat().st_mtime_ns == stamp


def test_the_download_is_removed_once_unpacked(server, tmp_path, capsys):
    """README: fetch -> data/hg38.fa (+ .fai); the plain gzip download stayed beside it (900 MB for hg38)."""
    url, plain = server
    d = tmp_path / "d"
    ready = fetch_fasta("hg38", d, url=url, progress=True)
    assert ready == d / "hg38.fa" and ready.read_bytes() == plain
    assert sorted(p.name for p in d.iterdir()) == ["hg38.fa", "hg38.fa.fai"]
    assert "(2 records)" in " ".join(capsys.readouterr().err.split())


def test_a_one_record_genome_is_counted_in_the_singular(server, tmp_path, capsys):
    url, _ = server
    GenomeServer.files["/g/one.fa.gz"] = gzip.compress(b">only\nACGTACGTAC\n", mtime=0)
    fetch_fasta("one", tmp_path, url=url.replace("hg38.fa.gz", "one.fa.gz"), md5="skip", progress=True)
    said = " ".join(capsys.readouterr().err.split())  # rich wraps lines at spaces
    assert "one.fa (1 record) — next:" in said and (tmp_path / "one.fa").is_file(), said


@pytest.mark.parametrize("bgzip", [False, True])
@pytest.mark.parametrize("damage", ["flipped", "cut"])
def test_a_download_that_cannot_be_unpacked_is_removed_and_fetched_again(server, tmp_path, bgzip, damage):
    """Damaged deflate data (zlib.error, had escaped as a traceback) or a gzip cut short: one line naming the
    download, which is removed, so a re-run downloads it again (had said "already downloaded" and failed again)."""
    url, plain = server
    good = GenomeServer.files["/g/hg38.fa.gz"]
    bad = bytearray(good)
    if damage == "flipped":
        bad[20:40] = bytes(b ^ 255 for b in bad[20:40])
    else:
        del bad[len(bad) // 2:]
    GenomeServer.files["/g/hg38.fa.gz"] = bytes(bad)
    d = tmp_path / "d"
    one_line(lambda: fetch_fasta("hg38", d, url=url, md5="skip", bgzip=bgzip),
             f"{d / 'hg38.fa.gz'}: truncated or corrupt gzip", "the download was removed")
    assert not d.exists() or list(d.iterdir()) == []
    GenomeServer.files["/g/hg38.fa.gz"] = good
    ready = fetch_fasta("hg38", d, url=url, md5="skip", bgzip=bgzip)
    assert (gzip.decompress(ready.read_bytes()) if bgzip else ready.read_bytes()) == plain


def test_second_fetch_does_not_download_again(server, tmp_path):
    url, _ = server
    ready = fetch_fasta("hg38", tmp_path / "d", url=url)
    n, stamp = len(GenomeServer.ranges), ready.stat().st_mtime_ns
    assert fetch_fasta("hg38", tmp_path / "d", url=url) == ready
    assert len(GenomeServer.ranges) == n and ready.stat().st_mtime_ns == stamp  # no download, no re-unpack


def test_unknown_genome_and_bad_url(tmp_path):
    with pytest.raises(LcftError, match="unknown genome 'mm99'"):
        fetch_fasta("mm99", tmp_path)
    with pytest.raises(LcftError, match="not an http"):
        fetch_fasta("hg38", tmp_path, url="ftp://example.org/x.fa.gz")


@pytest.mark.parametrize("victim_exists", [True, False])
def test_a_link_left_as_the_part_file_is_replaced_not_written_through(server, tmp_path, victim_exists):
    """A `.part` link in the download folder (to a file: resumed by appending to it; dangling: created through
    it): the download starts over in a file of its own and the linked file is neither changed nor made."""
    url, plain = server
    victim = tmp_path / "victim"
    if victim_exists:
        victim.write_bytes(b"keep me\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "hg38.fa.gz.part").symlink_to(victim)
    assert fetch_fasta("hg38", tmp_path / "d", url=url, retries=0).read_bytes() == plain
    assert not any(GenomeServer.ranges)  # no Range asked: nothing resumed from the link
    assert (victim.read_bytes() == b"keep me\n") if victim_exists else not victim.exists()


@pytest.mark.parametrize("name,kind", [("hg38.fa", "link"), ("hg38.fa.gz", "link"), ("hg38.fa.gz", "dangling link"),
                                       ("hg38.fa.gz", "folder")])
def test_a_download_name_that_is_not_a_regular_file_is_one_line_and_kept(server, tmp_path, name, kind):
    """A link (or a folder) under the download's name or its unpacked FASTA's: not a file a fetch wrote, so one
    line naming it, nothing asked of the server and nothing changed (a linked FASTA was taken as already fetched,
    unchecked; a linked gzip unpacked into a regular hg38.fa that later fetches took as their own)."""
    url, _ = server
    other = tmp_path / ("other.fa.gz" if name.endswith(".gz") else "other.fa")
    if kind == "link":
        fa = b">other\nTTTTTTTTTT\n"
        other.write_bytes(gzip.compress(fa, mtime=0) if name.endswith(".gz") else fa)
    d = tmp_path / "d"
    d.mkdir()
    if kind == "folder":
        (d / name).mkdir()
    else:
        (d / name).symlink_to(other)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(LcftError) as e:
        fetch_fasta("hg38", d, url=url)
    assert str(e.value) == f"{d / name} is not a file fetch wrote (a link, a folder or a FIFO); remove it and re-run"
    assert GenomeServer.ranges == [] and sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("bgzip", [False, True])
def test_the_long_step_after_the_download_is_named_first(server, tmp_path, capsys, bgzip):
    """Decompressing the download (half a minute for hg38) or recompressing it as BGZF (minutes) is named before
    it starts: nothing was shown between 'downloaded' and 'ready:'."""
    url, _ = server
    d = tmp_path / "d"
    fetch_fasta("hg38", d, url=url, bgzip=bgzip, progress=True)
    err = capsys.readouterr().err
    step = (f"recompressing {d / 'hg38.fa.gz'} as BGZF in its place" if bgzip
            else f"decompressing {d / 'hg38.fa.gz'} to {d / 'hg38.fa'}")
    assert err.index("downloaded ") < err.index(step) < err.index("ready:"), err
