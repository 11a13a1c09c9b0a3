"""`prepare fetch` resumes a .part only where it can check it continues the same file (fetch_http): a file changed
on its server, a range sent from another byte than asked, a .part longer than the file, a .part whose record is
missing, unreadable or of another URL, or one whose server gave nothing to check against (unless an md5 checks the
whole), is downloaded again from 0, said in one line (with --md5 skip nothing else would catch a stitched file); the
room it needs is asked first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcft.errors import LcftError
from lcft.genomics.fetch import fetch_fasta
from tests.genomics import test_fetch
from tests.genomics.conftest import random_genome, write_fasta
from tests.genomics.test_fasta_cache_space import _with_free
from tests.genomics.test_fetch import GenomeServer
from tests.one_line import one_line

source, server = test_fetch.source, test_fetch.server  # the fixtures: a genome, and GenomeServer serving it
AGAIN = "downloading it again from the start"
NOTHING_TO_CHECK = "its server gave no ETag, nor a Last-Modified a second or more before its Date, to check a resume against"


def _fasta(folder: Path, seed: int, length: int) -> bytes:
    return write_fasta(folder / f"{seed}.fa", {"chrA": random_genome(seed, length)}).read_bytes()


@pytest.fixture
def versions(server, tmp_path) -> tuple[str, bytes, bytes, bytes]:
    """/g/g.fa served (a plain FASTA: nothing to unpack), its URL; its bytes, another version of the same size
    and one shorter than half of it, to serve in its place."""
    url = server[0].replace("hg38.fa.gz", "g.fa")
    old, new, short = (_fasta(tmp_path, seed, n) for seed, n in ((11, 200_000), (12, 200_000), (13, 50_000)))
    assert len(old) == len(new) and old != new and len(short) < len(old) // 2
    GenomeServer.files["/g/g.fa"] = old
    return url, old, new, short


def _cut(url: str, d: Path, capsys: pytest.CaptureFixture) -> Path:
    """A fetch of `url` into `d` cut halfway (md5 skipped): its .part, holding the first half."""
    path = "/" + url.split("/", 3)[3]
    GenomeServer.cut = {path}
    with pytest.raises(LcftError, match="interrupted after"):
        fetch_fasta("g", d, url=url, md5="skip", retries=0)
    part = d / (path.rsplit("/", 1)[1] + ".part")
    assert part.read_bytes() == GenomeServer.files[path][:len(GenomeServer.files[path]) // 2]
    capsys.readouterr()
    return part


def _said(capsys: pytest.CaptureFixture) -> str:
    """The one line on stderr that says a .part is downloaded again."""
    lines = [line for line in capsys.readouterr().err.splitlines() if AGAIN in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("send", ["ETag", "Last-Modified"])
@pytest.mark.parametrize("if_range", [True, False])
def test_a_file_changed_on_its_server_is_downloaded_again_not_stitched(versions, tmp_path, monkeypatch, capsys,
                                                                       send, if_range):
    """The .part begun from one version, the rest asked of another of the same size: the rest is asked with
    If-Range and the validator recorded when the .part was begun, so a server that honours it sends the new
    version whole, and one that does not is caught by the validator its 206 carries. It was stitched from both."""
    url, old, new, _ = versions
    monkeypatch.setattr(GenomeServer, "send", frozenset({send}))
    monkeypatch.setattr(GenomeServer, "if_range", if_range)
    d = tmp_path / "d"
    part = _cut(url, d, capsys)
    GenomeServer.files["/g/g.fa"] = new
    assert fetch_fasta("g", d, url=url, md5="skip", retries=0).read_bytes() == new
    assert GenomeServer.if_ranges[1] == GenomeServer.validators(old)[send]
    assert GenomeServer.ranges[1:] == [f"bytes={len(old) // 2}-"] + ([] if if_range else [None])
    assert _said(capsys).startswith(f"{part}: {url} changed since it was begun ({send} ")
    assert sorted(p.name for p in d.iterdir()) == ["g.fa", "g.fa.fai"]


def test_a_resume_with_nothing_to_check_it_against_starts_over(versions, tmp_path, monkeypatch, capsys):
    """A server that sends neither ETag nor Last-Modified: a .part left by an earlier run is not continued (a
    change on the server in between could not be seen), it is downloaded again, said in one line."""
    url, old, _, _ = versions
    monkeypatch.setattr(GenomeServer, "send", frozenset())
    part = _cut(url, tmp_path, capsys)
    assert fetch_fasta("g", tmp_path, url=url, md5="skip", retries=0).read_bytes() == old
    assert GenomeServer.ranges[-1] is None
    assert _said(capsys) == f"{part}: {NOTHING_TO_CHECK}; {AGAIN}"


def test_a_last_modified_of_the_second_it_was_served_is_no_validator(versions, tmp_path, monkeypatch, capsys):
    """A server whose Last-Modified is its Date (a file written as it is served, or a server that dates every reply
    now): the same Last-Modified can name two versions of the file, and If-Range may not send it (RFC 9110
    13.1.5). The .part is downloaded again, said in one line; it had been resumed with If-Range on that date."""
    from email.utils import formatdate

    url, old, _, _ = versions
    monkeypatch.setattr(GenomeServer, "send", frozenset({"Last-Modified"}))
    monkeypatch.setattr(GenomeServer, "validators", classmethod(
        lambda cls, body: {"Last-Modified": formatdate(usegmt=True)}))  # now: the second of the reply's Date
    part = _cut(url, tmp_path, capsys)
    assert fetch_fasta("g", tmp_path, url=url, md5="skip", retries=0).read_bytes() == old
    assert GenomeServer.ranges[-1] is None and GenomeServer.if_ranges[-1] is None
    assert _said(capsys) == f"{part}: {NOTHING_TO_CHECK}; {AGAIN}"


def test_a_resume_without_validators_goes_on_where_an_md5_checks_the_whole(versions, tmp_path, monkeypatch, capsys):
    """The same server, the whole file's md5 given: the .part is continued (a Range without If-Range), as the
    md5 catches a file stitched from two versions; starting over would never finish a genome on a flaky link."""
    import hashlib

    url, old, _, _ = versions
    monkeypatch.setattr(GenomeServer, "send", frozenset())
    _cut(url, tmp_path, capsys)
    md5 = hashlib.md5(old).hexdigest()
    assert fetch_fasta("g", tmp_path, url=url, md5=md5, retries=0).read_bytes() == old
    assert GenomeServer.ranges[-1] == f"bytes={len(old) // 2}-" and GenomeServer.if_ranges[-1] is None
    assert AGAIN not in capsys.readouterr().err


@pytest.mark.parametrize("record", ["as written", "missing", "not JSON", "over 4 KiB", "not fetch's", "another URL"])
def test_a_part_without_its_own_record_starts_over(versions, tmp_path, capsys, record):
    """The record of what a .part was begun from (NAME.part.json) missing, unreadable, of other fields, or of
    another URL (a .part of the same name from another mirror, which serves another file): not continued,
    downloaded again from 0 and said in one line (it was continued, stitched from two files). As a fetch writes
    it: continued."""
    url, old, new, _ = versions
    part = _cut(url, tmp_path, capsys)
    rec = tmp_path / "g.fa.part.json"
    written = {"url": url, "etag": GenomeServer.validators(old)["ETag"], "modified": None, "size": len(old)}
    rec.write_text({"as written": json.dumps(written), "not JSON": '{"url": ', "over 4 KiB": " " * 4096 + json.dumps(written),
                    "not fetch's": json.dumps({**written, "etag": "a\r\nX-Injected: 1"})}.get(record, ""))
    if record == "missing":
        rec.unlink()
    elif record == "another URL":  # a record of the .part's own URL, which this fetch's is not
        rec.write_text(json.dumps(written))
        url = url.replace("/g/", "/h/")
        GenomeServer.files["/h/g.fa"] = new
    assert fetch_fasta("g", tmp_path, url=url, md5="skip", retries=0).read_bytes() == (
        new if record == "another URL" else old)
    if record == "as written":
        assert GenomeServer.ranges[-1] == f"bytes={len(old) // 2}-" and AGAIN not in capsys.readouterr().err
    else:
        assert GenomeServer.ranges[-1] is None
        said = _said(capsys)
        assert said.startswith(f"{part}: ") and said.endswith(AGAIN), said
    assert not rec.exists()


@pytest.mark.parametrize("now", ["whole", "shorter"])
def test_a_416_is_the_whole_file_only_when_its_size_is_the_parts(versions, tmp_path, monkeypatch, capsys, now):
    """A resume answered 416 'bytes */SIZE' (by a server that ignores If-Range): a .part of SIZE bytes (its rest
    arrived, the run was stopped before the rename) is the file, nothing downloaded again; one longer than the file
    (it shrank on the server) is downloaded again (it was kept as fetched)."""
    url, old, _, short = versions
    monkeypatch.setattr(GenomeServer, "if_range", False)
    part = _cut(url, tmp_path, capsys)
    if now == "whole":
        part.write_bytes(old)
    else:
        GenomeServer.files["/g/g.fa"] = short
    got = fetch_fasta("g", tmp_path, url=url, md5="skip", retries=0).read_bytes()
    asked = [f"bytes={len(old) if now == 'whole' else len(old) // 2}-"]
    if now == "whole":
        assert got == old and GenomeServer.ranges[1:] == asked
    else:
        assert got == short and GenomeServer.ranges[1:] == [*asked, None]
        assert _said(capsys) == f"{part}: {url} is {len(short):,} bytes, the .part holds {len(old) // 2:,}; {AGAIN}"


@pytest.mark.parametrize("shift", [1000, 10**12])
def test_a_part_sent_from_another_byte_is_not_appended(server, tmp_path, monkeypatch, capsys, shift):
    """A resume answered with a 206 from another byte than asked (1000 bytes before; from 0, a server that ignores
    the offset but says so): downloaded again from 0 (it was appended where the .part ended: a corrupt gzip)."""
    url, plain = server
    part = _cut(url, tmp_path, capsys)
    half = part.stat().st_size
    monkeypatch.setattr(GenomeServer, "shift", shift)
    assert fetch_fasta("hg38", tmp_path, url=url, md5="skip", retries=0).read_bytes() == plain
    assert GenomeServer.ranges[1:] == [f"bytes={half}-", None]
    assert _said(capsys) == f"{part}: {url} sent bytes from {max(0, half - shift):,} when asked for those from {half:,}; {AGAIN}"


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("gap", [-1, 0])
def test_the_room_a_download_needs_is_asked_first(versions, tmp_path, monkeypatch, capsys, held, gap):
    """Free space one byte under what the download adds (its size; on a resume, what the .part does not hold
    yet): one line naming both before a byte is written, the .part as it was (the disk was written until full);
    exactly that: downloaded."""
    url, old, _, _ = versions
    d = tmp_path / "d"
    part = _cut(url, d, capsys) if held else d / "g.fa.part"
    need = len(old) - (len(old) // 2 if held else 0)
    _with_free(monkeypatch, tmp_path, need + gap)
    if gap < 0:
        one_line(lambda: fetch_fasta("g", d, url=url, md5="skip", retries=0),
                 f"no space left on the device of {d}: the download of {url} needs at least "
                 f"{need / 2**20:.1f} MiB, {(need - 1) / 2**20:.1f} MiB free")
        assert (part.read_bytes() == old[:len(old) // 2]) if held else not part.exists()
        assert not (d / "g.fa").exists()
    else:
        assert fetch_fasta("g", d, url=url, md5="skip", retries=0).read_bytes() == old
    assert GenomeServer.ranges[-1] == (f"bytes={len(old) // 2}-" if held else None)
