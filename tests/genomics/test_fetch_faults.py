"""`fetch_fasta` when the link, the server or the disk fails it (a stall, a server error, a refused connection, a
file-size limit, a page sent instead of the genome, a bad --md5, a second fetch, a read-only folder): one line,
nothing kept that a rerun takes as complete, and what was received kept to resume."""

from __future__ import annotations

import gzip
import hashlib
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lcft.errors import RESUME, LcftError
from lcft.folder_lock import folder_lock
from lcft.genomics.fetch import fetch_fasta
from tests.genomics import test_fetch
from tests.genomics.test_fetch import GenomeServer
from tests.unprivileged import unprivileged

ROOT = Path(__file__).resolve().parents[2]
source, server = test_fetch.source, test_fetch.server  # the fixtures: a genome, and GenomeServer serving it


def test_what_arrived_before_a_stall_is_kept_to_resume(server, tmp_path):
    """The server sends a quarter of the body, then nothing until the client's timeout: those bytes are in the
    .part file (read in whole 1 MiB blocks, they were lost: 'interrupted after 0 bytes'), and the rerun asks
    for the rest."""
    url, plain = server
    GenomeServer.stall = {"/g/hg38.fa.gz"}
    body = GenomeServer.files["/g/hg38.fa.gz"]
    part = tmp_path / "d" / "hg38.fa.gz.part"
    with pytest.raises(LcftError, match=f"interrupted after {len(body) // 4} bytes"):
        fetch_fasta("hg38", tmp_path / "d", url=url, md5="skip", retries=0, timeout=0.5)
    assert part.read_bytes() == body[:len(body) // 4]
    assert fetch_fasta("hg38", tmp_path / "d", url=url, retries=0).read_bytes() == plain
    assert GenomeServer.ranges[-1] == f"bytes={len(body) // 4}-"


def test_a_server_error_or_refusal_is_said_as_it_is(server, tmp_path):
    """Retried, then one line naming the HTTP status or the connection's error (it said 'interrupted after 0
    bytes (HTTPError)' or '(URLError)', neither the status nor why)."""
    url, _ = server
    GenomeServer.fail = {"/g/hg38.fa.gz": 503}
    with pytest.raises(LcftError) as e:
        fetch_fasta("hg38", tmp_path / "d", url=url, md5="skip", retries=1)
    assert str(e.value) == f"cannot download {url}: HTTP 503 Service Unavailable (tried 2 times)"
    assert GenomeServer.ranges == [None, None] and not (tmp_path / "d").exists()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/hg38.fa.gz"
    with pytest.raises(LcftError) as e:
        fetch_fasta("hg38", tmp_path / "d", url=closed, md5="skip", retries=0)
    assert str(e.value).startswith(f"cannot download {closed}: ConnectionRefusedError: ") and "(tried once)" in str(e.value)


def test_a_download_past_the_file_size_limit_is_one_line_and_resumes(server, tmp_path):
    """A write of the .part file that fails (here EFBIG under `ulimit -f`, as ENOSPC on a full disk): one line
    naming the file and why, the bytes written kept (it was a traceback), and the rerun resumes from them."""
    url, plain = server
    limit = 50_000
    limited = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))  # noqa: E731
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run([sys.executable, "-m", "lcft", "prepare", "fetch", "hg38", "--url", url, "--md5", "skip",
                          "--out", str(tmp_path / "d")], preexec_fn=limited, env=env, capture_output=True,
                         text=True, timeout=300)
    part = tmp_path / "d" / "hg38.fa.gz.part"
    assert got.returncode == 1 and got.stderr.strip().splitlines()[-1] == (
        f"error: cannot write {part}: File too large (errno 27); the file-size limit (ulimit -f) is 50,000 bytes; "
        f"{RESUME} once it can be written"), got.stderr[-2000:]
    assert part.read_bytes() == GenomeServer.files["/g/hg38.fa.gz"][:limit]
    assert fetch_fasta("hg38", tmp_path / "d", url=url).read_bytes() == plain
    assert GenomeServer.ranges[-1] == f"bytes={limit}-"


@pytest.mark.parametrize("given", ["abc", "e" * 64, "0123456789abcdef0123456789abcdeg"])
def test_an_md5_that_is_none_is_refused_before_the_download(server, tmp_path, given):
    """A mistyped --md5 (or a sha256 pasted for it) is one line before anything is asked of the server: it was
    found only after the whole download, as a mismatch, and the download removed (900 MB for hg38)."""
    url, _ = server
    with pytest.raises(LcftError) as e:
        fetch_fasta("hg38", tmp_path / "d", url=url, md5=given)
    assert str(e.value) == f"--md5 '{given}' is not an md5 (32 hexadecimal digits) nor 'skip'"
    assert GenomeServer.ranges == [] and not (tmp_path / "d").exists()


def test_an_md5_given_in_capitals_or_with_spaces_is_read(server, tmp_path):
    url, plain = server
    given = f" {hashlib.md5(GenomeServer.files['/g/hg38.fa.gz']).hexdigest().upper()}\n"
    assert fetch_fasta("hg38", tmp_path / "d", url=url, md5=given).read_bytes() == plain


@pytest.mark.parametrize("page", ["plain", "gzip"])
def test_a_page_sent_instead_of_the_genome_is_removed(server, tmp_path, page):
    """A server (a captive portal, a mirror's error page) that answers 200 with HTML, as it is or gzipped: one
    line saying what came, and nothing left under the download's name (it was kept as downloaded: every re-run
    said 'already downloaded' and 'not a FASTA file' until it was removed by hand)."""
    url, plain = server
    html = b"<!DOCTYPE html>\n<html><body>Please log in</body></html>\n"
    GenomeServer.files["/g/hg38.fa.gz"] = html if page == "plain" else gzip.compress(html, mtime=0)
    d = tmp_path / "d"
    for _ in range(2):
        with pytest.raises(LcftError) as e:
            fetch_fasta("hg38", d, url=url, md5="skip")
        kept = d / ("hg38.fa.gz" if page == "plain" else "hg38.fa")  # (the gzip one once unpacked)
        assert str(e.value) == (f"{url} sent no FASTA: not a FASTA file: {kept} (first line '<!DOCTYPE html>' "
                                "does not start with '>'); it was removed (check the URL)")
        assert not d.exists()
    assert len(GenomeServer.ranges) == 2  # asked each time: nothing kept was taken as the download


def test_a_second_fetch_into_the_folder_is_one_line_and_asks_nothing(server, tmp_path):
    """While a fetch holds the folder, another is refused at once (two had written one .part, each unlinking or
    renaming it under the other: 'file not found: hg38.fa.gz.part', or a download retried to its end in vain);
    once it is done, the other finds the genome fetched."""
    url, plain = server
    d = tmp_path / "d"
    with folder_lock(d, "prepare fetch"):
        with pytest.raises(LcftError) as e:
            fetch_fasta("hg38", d, url=url)
        assert str(e.value) == (f"another `prepare fetch` is writing into {d} (pid {os.getpid()}); wait for it to "
                                "finish or choose another output folder")
    assert GenomeServer.ranges == [] and not d.exists()
    assert fetch_fasta("hg38", d, url=url).read_bytes() == plain


@pytest.mark.parametrize("fetched", [False, True])
def test_a_read_only_folder_is_one_line_or_read_as_fetched(server, tmp_path, fetched):
    """--out a folder this process may not write: one line (it was a traceback, PermissionError on the .part
    file); a folder of genomes fetched before, made read-only, still answers with the FASTA and writes nothing."""
    url, plain = server
    d = tmp_path / "d"
    d.mkdir()
    if fetched:
        fetch_fasta("hg38", d, url=url)
    before = sorted(p.name for p in d.iterdir())
    d.chmod(0o555)
    try:
        r = unprivileged([sys.executable, "-c", "import sys; from lcft.genomics.fetch import fetch_fasta; "
                          "print(fetch_fasta('hg38', sys.argv[1], url=sys.argv[2]))", str(d), url])
    finally:
        d.chmod(0o755)
    if fetched:
        assert r.returncode == 0 and r.stdout.strip() == str(d / "hg38.fa"), r.stderr[-2000:]
    else:
        assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
            f"lcft.errors.LcftError: cannot write to output folder {d}: Permission denied"), r.stderr[-2000:]
    assert sorted(p.name for p in d.iterdir()) == before
