"""`lcft prepare fetch`: download a reference FASTA with resume (HTTP Range) and md5 check, then make it
readable by pyfaidx (plain gzip NAME.fa.gz is decompressed to NAME.fa, or recompressed as BGZF in its place with
--bgzip)."""

from __future__ import annotations

import gzip
import http.client
import os
import re
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TransferSpeedColumn,
)

from lcft.console import make_console, styled, text_column, time_left_column
from lcft.disk import write_failure
from lcft.errors import RESUME, LcftError, printable, reason, shown
from lcft.files import atomic_open
from lcft.folder_lock import folder_lock
from lcft.foreign_entries import refuse_not_own
from lcft.genomics.fasta import FastaFile, fasta_start
from lcft.genomics.fasta_cache import check_room_to_decompress
from lcft.genomics.fasta_check import gzip_kind
from lcft.genomics.fasta_read import GZIP_DAMAGE
from lcft.genomics.fetch_http import SCHEMES, download_once, open_url, record_path
from lcft.hashing import file_hash
from lcft.units import counted

KNOWN = {"hg38": "https://hgdownload.soe.ucsc.edu/goldenPath/hg38/bigZips/hg38.fa.gz"}
NO_MD5 = "skip"
MD5_HEX = re.compile(r"[0-9a-fA-F]{32}")
# md5sum.txt is read whole into memory: UCSC's for hg38 is a few KB, so 1 MiB is far above any real list and
# bounds what a broken or hostile server can make us hold
MD5_LIST_LIMIT = 1 << 20


def published_md5(url: str, timeout: float = 60) -> str:
    """The md5 UCSC-style mirrors publish in md5sum.txt next to the file."""
    name = os.path.basename(urllib.parse.urlparse(url).path)
    md5_url = urllib.parse.urljoin(url, "md5sum.txt")
    try:
        with open_url(md5_url, timeout) as r:
            raw = r.read(MD5_LIST_LIMIT + 1)
    except (urllib.error.URLError, OSError) as e:
        raise LcftError(f"cannot read the published md5 at {md5_url} ({reason(e)}); pass --md5 HEX or --md5 {NO_MD5}") from None
    if len(raw) > MD5_LIST_LIMIT:
        raise LcftError(f"{md5_url} is over {MD5_LIST_LIMIT >> 20} MiB: not an md5 list; "
                        f"pass --md5 HEX or --md5 {NO_MD5}")
    text = raw.decode("utf-8", "replace")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == name:
            return parts[0].lower()
    raise LcftError(f"{md5_url} lists no md5 for {name}; pass --md5 HEX or --md5 {NO_MD5}")


def download(url: str, part: Path, *, retries: int = 3, progress: bool = False, timeout: float = 60,
             md5_checked: bool = False) -> Path:
    """Download `url` into `part`, appending to what an earlier interrupted call left there (HTTP Range, checked:
    fetch_http; `md5_checked`: the caller checks the whole file's md5, so a server without validators is resumed
    too); retries an interrupted transfer up to `retries` times in this call. Returns `part`, complete.
    A start over from 0 is said in one line on stderr."""
    label = part.name.removesuffix(".part")
    bar = (
        Progress(text_column(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), time_left_column(),
                 console=make_console(stderr=True))
        if progress else None
    )
    task = bar.add_task("download", total=None) if bar else None
    say = (lambda line: bar.console.print(line, soft_wrap=True)) if bar else _say
    try:
        if bar:
            bar.start()
        for attempt in range(retries + 1):
            try:
                download_once(url, part, bar, task, timeout, say, md5_checked)
                return part
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError,
                    ssl.SSLError) as e:
                if isinstance(e, urllib.error.HTTPError) and e.code < 500:
                    raise LcftError(f"cannot download {url}: {_failure(e)}") from None
                if attempt == retries:
                    raise _gave_up(url, part, e, retries + 1) from None
                time.sleep(min(2.0**attempt, 30.0) * 0.1)
            except OSError as e:  # writing the .part file (the link's errors are those above): what it holds stays
                raise LcftError(f"cannot write {part}: {write_failure(e)}; {RESUME} once it can be written") from None
    finally:
        if bar:
            bar.stop()
    return part


def _say(line: str) -> None:
    print(printable(line), file=sys.stderr, flush=True)


def _failure(e: Exception) -> str:
    """What failed a request, for a one-line message: the HTTP status, or the connection's error as the OS or
    http.client words it (a refusal, a name that does not resolve, a timeout, a body cut short)."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    cause = e.reason if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException) else e
    return f"{type(cause).__name__}: {reason(cause)}"


def _gave_up(url: str, part: Path, e: Exception, tries: int) -> LcftError:
    """The one line once the last try of a download failed: why, and what a rerun resumes from."""
    have = part.stat().st_size if part.exists() else 0
    if not have:
        return LcftError(f"cannot download {url}: {_failure(e)} (tried {'once' if tries == 1 else f'{tries} times'})")
    return LcftError(f"download of {url} interrupted after {have} bytes ({_failure(e)}); {RESUME}")


def _unpacked(dest: Path) -> Path:
    """Where a plain gzip download NAME.gz is decompressed to: NAME (a name without '.gz' stays as it is)."""
    return dest.with_name(dest.name.removesuffix(".gz"))


def _make_readable(gz: Path, bgzip: bool, con: Console | None = None) -> Path:
    """The downloaded file made readable by pyfaidx: plain gzip decompressed to NAME.fa, the download then removed
    (nothing reads it again), or with --bgzip recompressed as BGZF in its place (NAME.fa.gz); BGZF or an
    uncompressed FASTA is kept as it is. Written via .tmp and renamed: a file present is complete. Each step is
    named on `con` first: for hg38 a decompression takes about half a minute, a recompression minutes."""
    if gzip_kind(gz) != "gzip":
        return gz  # already BGZF (also after an earlier --bgzip), or not compressed at all
    if bgzip:
        from Bio import bgzf

        if con:
            con.print(f"recompressing {gz} as BGZF in its place (for random access)", soft_wrap=True)
        with atomic_open(gz, "wb") as raw, gzip.open(gz, "rb") as src, bgzf.BgzfWriter(fileobj=raw) as dst:
            while block := src.read(1 << 22):  # the open download is read while its BGZF copy replaces it
                dst.write(block)
        return gz
    target = _unpacked(gz)
    if target == gz:  # a gzip not named .gz: read as it is (lcft decompresses it into its cache)
        return gz
    if not target.exists():
        check_room_to_decompress(gz, target.parent)  # the download is kept: a re-run, given room, unpacks it
        if con:
            con.print(f"decompressing {gz} to {target}", soft_wrap=True)
        with atomic_open(target, "wb") as dst, gzip.open(gz, "rb") as src:
            shutil.copyfileobj(src, dst, 1 << 22)
    gz.unlink()
    return target


def fetch_fasta(
    name: str = "hg38",
    out: str | os.PathLike = "data",
    *,
    url: str | None = None,
    md5: str | None = None,
    bgzip: bool = False,
    retries: int = 3,
    progress: bool = False,
    timeout: float = 60,
) -> Path:
    """Download genome `name` (or `url`) into `out`, check its md5 (the published one from md5sum.txt next
    to it unless given; 'skip' to skip), make it pyfaidx-ready (_make_readable: hg38.fa.gz -> hg38.fa, or with
    `bgzip` hg38.fa.gz as BGZF) and index it. Returns the FASTA to prepare; a second call downloads nothing."""
    if url is None:
        if name not in KNOWN:
            raise LcftError(f"unknown genome {name!r}: known are {', '.join(KNOWN)} (or pass --url)")
        url = KNOWN[name]
    if urllib.parse.urlparse(url).scheme not in SCHEMES:
        raise LcftError(f"not an http(s) URL: {url}")
    if md5 is not None and md5 != NO_MD5:  # said before the download: every digest mismatches one that is no md5
        if not MD5_HEX.fullmatch(md5.strip()):
            raise LcftError(f"--md5 {shown(md5, quoted=True)} is not an md5 (32 hexadecimal digits) nor {NO_MD5!r}")
        md5 = md5.strip().lower()
    out_dir = Path(out)
    dest = out_dir / (os.path.basename(urllib.parse.urlparse(url).path) or f"{name}.fa.gz")
    _check_own(dest, bgzip)
    con = make_console(stderr=True) if progress else None
    ready = _fetched(dest, bgzip)
    if ready is None:
        # one fetch at a time into a folder: two wrote one .part, each replacing or renaming it under the other;
        # a folder made for a download that fails before writing is removed
        with folder_lock(out_dir, "prepare fetch"):
            ready = _fetched(dest, bgzip) or _fetch(url, dest, md5, bgzip, retries, timeout, con)
    elif con:
        con.print(f"{ready} already fetched")
    with FastaFile(ready) as fa:  # builds .fai (and .gzi) and checks the FASTA
        n = len(fa.names)
    if con:
        con.print(styled(("ready:", "green"), f" {ready} ({counted(n, 'record')}) — next: lcft prepare windows --fasta {ready} --out DIR"))
    return ready


def _fetched(dest: Path, bgzip: bool) -> Path | None:
    """The FASTA an earlier fetch left ready, found without writing (a read-only folder of fetched genomes serves
    as it is): the download as _make_readable leaves it (BGZF, or not compressed), or, without --bgzip, the
    FASTA it was decompressed to and then removed. None where there is work to do."""
    if dest.exists():
        return dest if gzip_kind(dest) != "gzip" else None
    unpacked = _unpacked(dest)
    return unpacked if not bgzip and unpacked != dest and unpacked.exists() else None


def _check_own(dest: Path, bgzip: bool) -> None:
    """Refuse a download, or its unpacked FASTA, that is there but not a regular file: what a fetch finds under
    those names is taken as an earlier fetch's (whose md5 check came before them), but a link is no file of ours,
    and a plain gzip one would be unpacked, unchecked, into a regular file that later fetches take."""
    for p in (dest,) if bgzip else (dest, _unpacked(dest)):
        refuse_not_own(p, "fetch")


def _fetch(url: str, dest: Path, md5: str | None, bgzip: bool, retries: int, timeout: float,
           con: Console | None) -> Path:
    """`url` downloaded to `dest` (unless there already) with its md5 checked, then made readable."""
    if not dest.exists():
        want = None if md5 == NO_MD5 else (md5 or published_md5(url, timeout))
        part = download(url, dest.with_name(dest.name + ".part"), retries=retries, progress=con is not None,
                        timeout=timeout, md5_checked=want is not None)
        got = file_hash(part, "md5").hexdigest()
        if want is not None and got != want:
            part.unlink()
            record_path(part).unlink(missing_ok=True)
            source = "given by --md5" if md5 else "published"
            raise LcftError(f"md5 mismatch for {url}: got {got}, {source} {want}; the download was removed, re-run")
        os.replace(part, dest)
        record_path(part).unlink(missing_ok=True)  # after: a .part without its record would be downloaded again
        if con:
            con.print(f"downloaded {dest} (md5 {'checked' if want else 'not checked'}: {got})")
    elif con:
        con.print(f"{dest} already downloaded")
    try:
        ready = _make_readable(dest, bgzip, con)
    except GZIP_DAMAGE as e:  # kept, every re-run would take it as downloaded and fail on it again
        dest.unlink()
        raise LcftError(f"cannot unpack {dest}: truncated or corrupt gzip ({reason(e)}); the download was removed, "
                        "re-run to download it again") from None
    except OSError as e:  # the disk, not the download: kept for a re-run
        raise LcftError(f"cannot unpack {dest}: {reason(e)}") from None
    try:  # a page sent with 200 (an error, a login form): kept, every re-run would take it as fetched
        fasta_start(ready, gzip_kind(ready))
    except LcftError as e:
        ready.unlink()
        raise LcftError(f"{url} sent no FASTA: {e}; it was removed (check the URL)") from None
    return ready
