"""The HTTP side of `lcft prepare fetch`: requests that follow only http(s) redirects, and one download step into
NAME.part that resumes only what it can check (If-Range with the validator recorded in NAME.part.json when the
.part was begun; a 206's start and size, a 416's size), asks for its room first and again as it goes (a reply of
known size stops once its rest no longer fits; one of unknown size while the disk still has room), and else starts
over from 0; a disk that fills is one line."""

from __future__ import annotations

import email.message
import email.utils
import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from rich.progress import Progress

from lcft.disk import check_room, kept_free, mib, out_of_room
from lcft.errors import LcftError, shown
from lcft.files import atomic_write, fresh_file, read_json
from lcft.foreign_entries import open_own

BLOCK = 1 << 20
ROOM_CHECK = 16 * BLOCK  # a download asks for the free space again after at most this many bytes
SCHEMES = ("http", "https")
RECORD_LIMIT = 1 << 12  # NAME.part.json holds a URL, two header values and a size: read no further
HEADER_VALUE = re.compile(r"[\x20-\x7e]{1,1024}")  # a validator sent back as it is: one printable header value
COUNT = re.compile(r"\d{1,19}")  # a byte count a header gives: at most 19 digits, which int() reads at once
SENT_RANGE = re.compile(r"bytes (\d{1,19})-(\d{1,19})/(\d{1,19})")  # a 206's Content-Range
NO_RANGE = re.compile(r"bytes \*/(\d{1,19})")  # a 416's Content-Range: the file's size
AGAIN = "downloading it again from the start"

Say = Callable[[str], None]


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to another http(s) URL (urllib's default also follows one to ftp://)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: email.message.Message, newurl: str) -> urllib.request.Request | None:
        target = urllib.parse.urljoin(req.full_url, newurl)
        if urllib.parse.urlparse(target).scheme not in SCHEMES:
            raise LcftError(f"{req.full_url} redirects to {target}: not an http(s) URL (refused)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_url(req: str | urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
    """urlopen whose every redirect hop must be http(s)."""
    return urllib.request.build_opener(_HttpOnlyRedirects).open(req, timeout=timeout)


@dataclass(frozen=True)
class Begun:
    """What a .part was begun from: its URL, the server's validators of that version of the file (a strong ETag;
    a strong Last-Modified: `_strong_modified`) and its size (None where the server did not say)."""

    url: str
    etag: str | None
    modified: str | None
    size: int | None

    def validator(self) -> str | None:
        """What If-Range sends: the ETag, else Last-Modified (a weak ETag is never recorded: If-Range refuses it)."""
        return self.etag or self.modified


def record_path(part: Path) -> Path:
    """Where the record of what `part` was begun from is kept: NAME.part.json beside it."""
    return part.with_name(part.name + ".json")


def _header(headers: email.message.Message, name: str) -> str | None:
    value = (headers.get(name) or "").strip()
    return value if HEADER_VALUE.fullmatch(value) else None


def _strong_modified(headers: email.message.Message) -> str | None:
    """The reply's Last-Modified where it can tell one version of the file from another: at least a second before
    the reply's Date (RFC 9110 8.8.2.2; If-Range may send no other date, RFC 9110 13.1.5). A file written again
    within the second it was served has the same Last-Modified: a .part begun from it is not resumed against it."""
    modified, date = _header(headers, "Last-Modified"), _header(headers, "Date")
    try:
        strong = modified and date and (email.utils.parsedate_to_datetime(date)
                                        - email.utils.parsedate_to_datetime(modified)).total_seconds() >= 1
    except (TypeError, ValueError):  # no date, or one that is no HTTP date
        strong = False
    return modified if strong else None


def _begun_by(url: str, headers: email.message.Message, size: int | None) -> Begun:
    etag = _header(headers, "ETag")
    return Begun(url, None if etag is None or etag.startswith("W/") else etag, _strong_modified(headers), size)


def _read_begun(part: Path) -> Begun | str:
    """The record of what `part` was begun from, or why there is none to trust."""
    rec = record_path(part)
    if not os.path.lexists(rec):
        return f"no record of what it was begun from ({rec.name} is missing)"
    try:
        data: dict[str, Any] = read_json(rec, limit=RECORD_LIMIT)
    except LcftError as e:
        return f"its record cannot be read ({e})"
    values = [data.get(k) for k in ("url", "etag", "modified", "size")]
    size = values[3]
    if not (isinstance(values[0], str) and all(v is None or isinstance(v, str) and HEADER_VALUE.fullmatch(v)
                                               for v in values[1:3])
            and (size is None or type(size) is int and size >= 0)):
        return f"its record {rec.name} is not one fetch writes"
    return Begun(*values)


def _resumable(url: str, part: Path, held: int, say: Say, md5_checked: bool) -> Begun | None:
    """The record `part` (holding `held` bytes) resumes against, or None, said in one line, to start over. A
    server without validators is resumed only where an md5 checks the whole file at the end (a flaky link to such
    a server could otherwise never finish a genome)."""
    begun = _read_begun(part)
    if isinstance(begun, str):
        why = begun
    elif begun.url != url:
        why = f"it was begun from another URL, {shown(begun.url)}"
    elif begun.validator() is None and not md5_checked:
        why = "its server gave no ETag, nor a Last-Modified a second or more before its Date, to check a resume against"
    elif begun.size is not None and held > begun.size:
        why = f"it holds {held:,} bytes, more than the {begun.size:,} of the file it was begun from"
    else:
        return begun
    say(f"{part}: {why}; {AGAIN}")
    return None


def _changed(url: str, headers: email.message.Message, begun: Begun) -> str | None:
    """Why a reply's validators say `url` is no longer the file `begun` recorded, or None (the same, or unsaid)."""
    for name, was in (("ETag", begun.etag), ("Last-Modified", begun.modified)):
        now = _header(headers, name)
        if was is not None and now is not None and now != was:
            return f"{url} changed since it was begun ({name} {shown(was)}, now {shown(now)})"
    return None


def _unsatisfied(url: str, headers: email.message.Message, asked: int, begun: Begun) -> str | None:
    """Why a 416 to a request from byte `asked` leaves the .part unchecked, or None: it is the whole file."""
    m = NO_RANGE.fullmatch((headers.get("Content-Range") or "").strip())
    if m is None:
        return f"{url} refused the range from byte {asked:,} without saying its size"
    size = int(m[1])
    if size != asked or begun.size not in (None, size):
        return f"{url} is {size:,} bytes, the .part holds {asked:,}"
    return _changed(url, headers, begun)


def _placed(url: str, resp: http.client.HTTPResponse, asked: int, begun: Begun | None) -> tuple[int, int | None, str | None]:
    """Where a reply's body goes and the whole file's size: (start, size, None), or why it does not continue the
    .part. A whole file (200) starts at 0; a part (206) must start where it was asked and be of the same file."""
    length = (resp.headers.get("Content-Length") or "").strip()
    if resp.status != 206:
        return 0, int(length) if COUNT.fullmatch(length) else None, None
    m = SENT_RANGE.fullmatch((resp.headers.get("Content-Range") or "").strip())
    if m is None:
        return 0, None, f"{url} sent a part without saying which (Content-Range bytes START-END/SIZE)"
    start, end, size = map(int, m.groups())
    if start != asked:
        return 0, None, f"{url} sent bytes from {start:,} when asked for those from {asked:,}"
    if not start <= end < size or (length and length != str(end - start + 1)):
        return 0, None, f"{url} sent a part whose Content-Range and Content-Length disagree"
    if begun is not None and begun.size not in (None, size):
        return 0, None, f"{url} is now {size:,} bytes, {begun.size:,} when the .part was begun"
    return start, size, None if begun is None else _changed(url, resp.headers, begun)


def _reply(url: str, part: Path, asked: int, begun: Begun | None, timeout: float,
           say: Say) -> tuple[http.client.HTTPResponse | None, int, int | None]:
    """The reply that continues `part` from byte `asked` (If-Range: only while the file is the one `begun`
    recorded), or the whole file: (reply, start, size); (None, asked, asked) when a 416 says `part` is whole. A
    reply that does not fit is said in one line and the whole file asked for instead."""
    validator = begun.validator() if begun else None
    for ask in dict.fromkeys((asked, 0)):
        headers = {"Range": f"bytes={ask}-", **({"If-Range": validator} if validator else {})} if ask and begun else {}
        try:
            resp = open_url(urllib.request.Request(url, headers=headers), timeout)
        except urllib.error.HTTPError as e:
            if e.code != 416 or not headers or begun is None:
                raise
            e.close()
            if (why := _unsatisfied(url, e.headers, ask, begun)) is None:
                return None, ask, ask
        else:
            start, size, why = _placed(url, resp, ask, begun if headers else None)
            if why is None:
                if ask and not start:  # If-Range found another file, or the server does not resume
                    said = _changed(url, resp.headers, begun) if begun else None
                    say(f"{part}: {said or f'{url} sent the whole file'}; {AGAIN}")
                return resp, start, size
            resp.close()
            if not ask:
                raise LcftError(f"cannot download {url}: {why}")
        say(f"{part}: {why}; {AGAIN}")
    raise AssertionError("unreachable: the request for the whole file returns or raises")


def download_once(url: str, part: Path, bar: Progress | None, task: int | None, timeout: float, say: Say,
                  md5_checked: bool = False) -> None:
    """Fetch the rest of `url` into `part` (appending from its current size with a checked Range request;
    `md5_checked`: the whole file's md5 is checked after, so a server without validators is resumed too). Only a
    regular file is resumed: a link left under its name is replaced, never written through."""
    kept = open_own(part)
    try:
        _download_into(url, part, kept, bar, task, timeout, say, md5_checked)
    finally:
        if kept is not None:
            kept.close()


def _download_into(url: str, part: Path, kept: IO[bytes] | None, bar: Progress | None, task: int | None,
                   timeout: float, say: Say, md5_checked: bool) -> None:
    held = os.fstat(kept.fileno()).st_size if kept is not None else 0
    begun = _resumable(url, part, held, say, md5_checked) if held else None
    resp, start, size = _reply(url, part, held if begun else 0, begun, timeout, say)
    if resp is None:  # nothing left to send: the part file is the whole file
        return
    with resp:
        # what is held now is replaced or kept: the room asked for is what the whole file adds to it
        check_room(part.parent, max(0, (size or 0) - held), f"the download of {url}")
        if bar is not None:
            bar.update(task, total=size or None, completed=start)
        if start:
            fh, record = kept, begun
        else:  # begun again: the .part emptied first, then its record, so no record ever vouches for other bytes
            fh, record = os.fdopen(fresh_file(part), "wb"), _begun_by(url, resp.headers, size)
            atomic_write(record_path(part), json.dumps(asdict(record)))
        assert fh is not None and record is not None
        with fh:
            fh.seek(start)
            part_file = _Part(fh.fileno(), part, url, start, md5_checked or record.validator() is not None)
            # what has arrived, up to BLOCK: read(BLOCK) waited for a whole block, so a slow link's bar stood
            # still and a stall or a Ctrl-C lost up to a block received but not written
            room_until = start  # asked again as it goes: another writer may take the room asked for above
            while block := resp.read1(BLOCK):
                if part_file.written + len(block) > room_until:
                    rest = None if size is None else size - part_file.written
                    room_until = part_file.written + part_file.room(len(block), rest)
                part_file.write(block)
                if bar is not None:
                    bar.advance(task, len(block))
    if size and part.stat().st_size < size:
        raise http.client.IncompleteRead(b"", size - part.stat().st_size)


@dataclass
class _Part:
    """The .part being written through descriptor `fd`: `written`, its bytes the OS took whole; `resumes`,
    whether a rerun can resume it (a validator to check it against, or an md5 that checks the whole file)."""

    fd: int
    path: Path
    url: str
    written: int
    resumes: bool

    def write(self, block: bytes) -> None:
        """Append `block`, unbuffered, so `written` counts only what the OS took; a failed write stops (`stop`)."""
        view = memoryview(block)
        try:
            while view:
                n = os.write(self.fd, view)
                self.written, view = self.written + n, view[n:]
        except OSError as e:
            self.stop(e)

    def room(self, adding: int, rest: int | None) -> int:
        """How many bytes may be written before the free space is asked again: at most ROOM_CHECK. A download of
        known size stops where the `rest` of its file no longer fits (as asked before its first byte); one of
        unknown size (`rest` None) where `adding` would leave less than such a write keeps free (disk.kept_free),
        and writes no more than leaves that."""
        if (usage := kept_free(self.path.parent)) is None:
            return ROOM_CHECK
        free, kept = usage
        if rest is not None:
            if free < rest:
                self.stop(None, f" ({mib(free)} free, {mib(rest)} of the file still to come)")
            return ROOM_CHECK
        if free - adding < kept:
            self.stop(None, f" ({mib(free)} free; a download of unknown size stops short of the last {mib(kept)})")
        return min(ROOM_CHECK, free - kept)

    def stop(self, e: OSError | None, why: str = "") -> NoReturn:
        """Cut the .part back to the bytes written whole and sync it, so a resume appends after valid bytes only
        (a write cut short, or one a network filesystem refuses later, may leave a torn tail), then re-raise `e`,
        or, for no room (`e` None: the free space asked for; ENOSPC, EDQUOT), one line. A .part that cannot be
        synced loses its record (nothing vouches for it); one nothing resumes is removed, its space freed."""
        try:
            os.ftruncate(self.fd, self.written)
            os.fsync(self.fd)
        except OSError:
            record_path(self.path).unlink(missing_ok=True)
            self.resumes = False
        if e is not None and not out_of_room(e):
            raise e
        if not (self.resumes and self.written):
            self.path.unlink(missing_ok=True)
            record_path(self.path).unlink(missing_ok=True)
        again = "the download resumes" if self.resumes and self.written else "the download starts over"
        raise LcftError(f"no room left in {self.path.parent} after {mib(self.written)} of {self.url}{why}: "
                        f"free space and run again; {again}")
