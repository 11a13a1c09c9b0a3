"""lcft's cache of files derived from a FASTA: decompressed and normalized copies (each checked against the record
made with it), links named for pyfaidx, indexes for read-only inputs; the gzip kind that decides which of them a
FASTA needs; what the cache holds, when each entry was last used, and removing those unused for a while."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from lcft.disk import check_room
from lcft.errors import LcftError, printable, reason
from lcft.files import parse_json, read_text, replacing_together
from lcft.foreign_entries import not_own
from lcft.genomics.fasta_check import NORMALIZED
from lcft.genomics.fasta_read import GZIP_DAMAGE
from lcft.genomics.gzip_size import gzip_size_floor

PARTS = ("fasta", "links", "index")  # the cache's folders: every file in them is derived, made again when needed
RECORD = ".sum"  # beside a copy: {"bytes", "sha256"} of the copy as it was made, checked before it is reused
# what sits beside a cache entry's file, part of its entry: its indexes (links/, fasta/; in index/ they are the entry)
# and a copy's record
BESIDE_SUFFIXES = (".fai", ".gzi", RECORD)
CacheKind = Literal["decompressed", "normalized", "link", "link to a missing file", "index", "unfinished"]


def cache_dir() -> Path:
    """Where lcft keeps derived files (decompressed FASTA, indexes for read-only inputs): $LCFT_CACHE, else lcft/
    in $XDG_CACHE_HOME (the XDG base directories' cache, where a cluster points it at scratch space; an absolute
    path only, as the specification says a relative one is to be ignored), else ~/.cache/lcft; a leading '~' in
    LCFT_CACHE is the home folder (set in quotes or an env file, no shell expands it: else a folder named '~' would
    appear in the working folder)."""
    if given := os.environ.get("LCFT_CACHE"):
        return Path(os.path.expanduser(given))
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) / "lcft" if os.path.isabs(xdg) else Path(os.path.expanduser("~/.cache/lcft"))


def cache_folder(part: str) -> Path:
    """The cache's folder for one kind of entry ("fasta", "index", "links"), made when missing: one that cannot
    be made (LCFT_CACHE a file, or on a read-only filesystem) is a one-line error naming it. A read-only cache
    that holds the folder serves what it holds."""
    folder = cache_dir() / part
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LcftError(f"cannot use the cache folder {folder} ({e.strerror or reason(e)}): set LCFT_CACHE to a writable "
                        "folder") from None
    return folder


def check_room_to_decompress(gz: Path, folder: Path) -> None:
    """One line, before writing, when `folder` has less free space than the gzip file `gz` decompresses to
    (gzip_size_floor: past 4 GiB it may read lower, by 4 GiB steps, and the write then fails, one line, once the
    disk is full)."""
    check_room(folder, gzip_size_floor(gz), f"decompressing {gz} (at least the size its gzip trailer and length "
               "allow, which a cut or damaged file gives wrong)")


def file_key(path: Path) -> str:
    """A short name for this path as it is now (resolved path, size, modification time), for what follows the
    path rather than copying its bytes (a link to it, an index of it, which is checked against the file when
    reused); a changed size or time gives a new one. Copies of the content are named by its sha256 instead:
    a rewrite may keep both (`cp -p`, `touch -r`, `rsync -t`)."""
    st = path.stat()
    key = os.fsencode(path.resolve()) + f"|{st.st_size}|{st.st_mtime_ns}".encode()  # a path's bytes, whatever the locale
    return hashlib.sha256(key).hexdigest()[:16]


NORMALIZED_RULES = "r2"  # in its name: changed whenever what a normalized copy drops changes, so none made under
# other rules is reused (r1, unnamed: every trailing Unicode blank went; r2: spaces and tabs, as Biopython)


def _copy_name(sha256: str, name: str) -> str:
    """The cache's name for a copy derived from a file with this sha256 (128 bits of it: no two genomes meet)."""
    return f"{sha256[:32]}-{name}"


class _Hashed(io.RawIOBase):
    """A binary file read through sha256: what a copy was made from, to check against the digest it is named by."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.digest = fh, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:
        n = self.fh.readinto(b)
        if n:
            self.digest.update(memoryview(b)[:n])
        return n or 0


def _copy_into_cache(path: Path, sha256: str, dest: Path, what: str, write: Callable[[IO[bytes], IO[bytes]], None],
                     doing: str) -> None:
    """Make the copy `dest` with `write(source, tmp)`, hashing the bytes it reads: a file that changed since its
    sha256 was taken (rewritten in place while being read) leaves no copy under a name that is not its own. The
    copy's own size and sha256 go beside it (RECORD), put in place after it: a record names a whole copy. `doing`
    names the stage on stderr first: a genome's copy takes a minute, before any progress bar of the command."""
    print(f"{doing} {printable(str(path))} into {printable(str(dest.parent))} (once: later runs reuse the copy)",
          file=sys.stderr, flush=True)
    record = dest.with_name(dest.name + RECORD)
    try:
        with replacing_together([dest, record]) as (tmp, tmp_record):
            with open(path, "rb") as fh, open(tmp, "wb") as out:
                src = io.BufferedReader(_Hashed(fh), 1 << 20)
                write(src, out)
                while src.read(1 << 22):  # what the reader left after its end (gzip's trailing bytes), hashed too
                    pass
                got = src.raw.digest.hexdigest()
            if got != sha256:
                raise LcftError(f"{path} changed while it was read (sha256 {sha256[:12]} when opened, {got[:12]} "
                                "read): open it again once it is complete")
            tmp_record.write_text(json.dumps(_record_of(tmp)))
    except GZIP_DAMAGE as e:  # the source's gzip data, not the cache: before OSError, of which BadGzipFile is one
        raise LcftError(f"{path}: truncated or corrupt gzip, cannot {what} ({reason(e)})") from None
    except OSError as e:
        raise LcftError(f"{path}: cannot {what} into {dest.parent}: {reason(e)}") from None


def _record_of(copy: Path) -> dict[str, int | str]:
    """{"bytes", "sha256"} of a copy, read through one 256 KiB buffer (hashlib.file_digest): a copy of one long
    line is made holding a few 1 MiB pieces, and is hashed in less."""
    with open(copy, "rb") as fh:
        return {"bytes": os.fstat(fh.fileno()).st_size, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}


def _reusable(dest: Path) -> bool:
    """Whether the cache holds the copy `dest` as it was made: a regular file of the size and sha256 its RECORD
    gives (hashed at each reuse, ~450 MB/s a core: a copy changed in place after it was made is never read). A
    copy with no record (or an unreadable one) is made again; one that differs from its record, with a note."""
    record = dest.with_name(dest.name + RECORD)
    if not_own(dest) or not dest.exists():  # (a link or a folder under its name: never read, replaced)
        return False
    try:
        made = parse_json(read_text(record, 1 << 10), str(record))
    except LcftError:
        return False
    try:
        if isinstance(made, dict) and made.get("bytes") == dest.stat().st_size and made == _record_of(dest):
            return True
    except OSError:  # a copy this user may not read (a shared cache, another owner's): made again, or one line there
        return False
    print(f"note: the cache's copy {dest} is not as it was made (its size or sha256 differs from {record.name}): "
          "making it again", file=sys.stderr, flush=True)
    return False


def decompress_to_cache(path: Path, sha256: str) -> Path:
    """Plain gzip cannot be read at random: decompress it once (streamed) into the cache, named by the sha256
    of the compressed file, and reuse that copy for as long as a file with those bytes is opened."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name + ".fa"
    dest = cache_folder("fasta") / _copy_name(sha256, name)
    if not _reusable(dest):
        check_room_to_decompress(path, dest.parent)
        _copy_into_cache(path, sha256, dest, "decompress gzip FASTA",
                         lambda src, out: shutil.copyfileobj(gzip.GzipFile(fileobj=src), out, 1 << 22), "unpacking")
    return mark_used(dest)


def named_for_pyfaidx(path: Path, kind: str) -> Path:
    """pyfaidx picks its reader from the file name (.gz/.bgz = BGZF); when the name disagrees with the
    content, give it a symlink in the cache whose name matches the content."""
    compressed_name = path.name.lower().endswith((".gz", ".bgz"))
    if compressed_name == (kind == "bgzf"):
        return path
    link = cache_folder("links") / f"{file_key(path)}-{path.name}{'.gz' if kind == 'bgzf' else '.fa'}"
    if not link.is_symlink():
        link.symlink_to(path.resolve())
    return mark_used(link)


NORMALIZE_PIECE = 1 << 20  # bytes read at a time: a line, however long, is never held whole


def normalize_lines(src: IO[bytes], out: IO[bytes], piece: int = NORMALIZE_PIECE) -> None:
    """Write `src` with LF line ends (CRLF and CR-only ends read as LF, as universal newlines read them), the spaces
    and tabs ending each line dropped (blanks as Biopython takes them: a form feed is kept, as it keeps it) and the
    lines left empty dropped, every line ended. Read `piece` bytes at a time into memory of a few pieces, whatever
    the file's lines: a line longer than a piece is written as it comes, its blanks held back until what follows
    them shows whether they end it (blanks over a piece long are written, then cut off again if they do: `out` is
    seekable)."""
    lines, cr = _OpenLine(out, piece), b""  # cr: a CR ending the last piece, whose LF may start the next
    while data := src.read(piece):
        data = cr + data
        cr = data[-1:] if data.endswith(b"\r") else b""
        lines.feed(data[: len(data) - len(cr)].replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
    lines.feed(b"\n")  # ends the last line (a CR held ends it as well: one LF for both)


class _OpenLine:
    """`normalize_lines`'s writer, fed LF-ended text a piece at a time: the line still open at a piece's end is
    written up to its last byte but blanks; those are held (over a piece of them: written, and `mark` where they
    start, to cut them off again if the line ends after them)."""

    def __init__(self, out: IO[bytes], piece: int) -> None:
        self.out, self.piece = out, piece
        self.started = False  # the open line's non-blank bytes are written (its LF is owed)
        self.held = b""  # the blanks ending the open line so far
        self.mark: int | None = None  # where blanks of the open line written to `out` start

    def feed(self, data: bytes) -> None:
        if self.mark is not None:  # the blanks written since `mark` stay only if a byte but LF and blank follows
            blanks = len(data) - len(data.lstrip(b" \t"))
            if blanks == len(data):
                self.out.write(data)
                return
            if data[blanks] == 10:  # their line ends: cut them off
                self.out.seek(self.mark)
                self.out.truncate()
                data = data[blanks:]
            else:
                self.started = True
            self.mark = None
        text = self.held + data
        ended = text.rfind(b"\n") + 1
        if ended:
            self._lines(text[:ended])
        rest = text[ended:]  # the open line's next bytes
        kept = rest.rstrip(b" \t")
        if kept:
            self.out.write(kept)
            self.started = True
        self.held = rest[len(kept):]
        if len(self.held) > self.piece:
            self.mark = self.out.tell()
            self.out.write(self.held)
            self.held = b""

    def _lines(self, text: bytes) -> None:
        """Whole lines (`text` ends with LF), the first the rest of the open line: each written without its ending
        blanks, unless that leaves it empty."""
        lines = [line.rstrip(b" \t") for line in text.split(b"\n")[:-1]]
        if self.started and not lines[0]:
            self.out.write(b"\n")
        kept = [line for line in lines if line]
        if kept:
            self.out.write(b"\n".join(kept) + b"\n")
        self.started = False


def normalize_to_cache(path: Path, kind: str, sha256: str) -> Path:
    """A copy with LF line ends, no blank lines and no blanks ending a line, for what pyfaidx mis-indexes:
    old-Mac CR-only line ends (read as one line), Windows CRLF files with blank lines (rejected as inconsistent)
    and blanks ending lines (counted as bases). Named, like a decompressed copy, by the sha256 of the file as
    given, and by the rules it is made under."""
    name = f"{path.name.removesuffix('.gz')}.{NORMALIZED_RULES}{NORMALIZED}"
    dest = cache_folder("fasta") / _copy_name(sha256, name)

    def write(src: IO[bytes], out: IO[bytes]) -> None:
        # the GzipFile is left open, not closed: what follows its end in the source is hashed too
        normalize_lines(gzip.GzipFile(fileobj=src) if kind != "plain" else src, out)

    if not _reusable(dest):
        _copy_into_cache(path, sha256, dest, "normalize line endings", write, "normalizing the line ends of")
    return mark_used(dest)


def discard_copies(sha256: str) -> None:
    """Remove the cache's copies of the file with this sha256 (decompressed, normalized) and what lies beside them:
    a file lcft refuses is never read from them, and a genome's copy holds its size on disk. One that cannot be
    removed (a shared cache's, another owner's) stays."""
    folder = cache_dir() / "fasta"
    for f in sorted(folder.glob(f"{_copy_name(sha256, '')}*")) if folder.is_dir() else []:
        try:
            f.unlink()
        except OSError:  # (a folder under a copy's name: not_own, never read)
            pass


def writable_dir(path: Path) -> bool:
    """Writable for us, and not marked read-only (root passes os.access even on r-x folders such as a
    shared data folder, which we should still leave alone)."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def index_paths(readable: Path, kind: str, stale: bool = False) -> dict[str, str]:
    """Indexes next to the FASTA when that folder is writable (or they are already fresh there); otherwise
    in the cache (read-only inputs, e.g. an installed package or a shared data folder), which a read-only
    folder's own index gives way to once the cache holds one for this file. stale: the ones next to it do not
    describe it, however new."""
    mtime = readable.stat().st_mtime

    def fresh(stem: str) -> bool:
        return all(p.is_file() and p.stat().st_mtime >= mtime
                   for p in [Path(stem + ".fai")] + ([Path(stem + ".gzi")] if kind == "bgzf" else []))

    base = cache_dir() / "index" / f"{file_key(readable)}-{readable.name}"
    if writable_dir(readable.parent) or (not stale and fresh(str(readable)) and not fresh(str(base))):
        return {}
    base = cache_folder("index") / base.name
    out = {"indexname": str(base) + ".fai"}
    if kind == "bgzf":
        out["gzi_indexname"] = str(base) + ".gzi"
    mark_used(Path(out["indexname"]))
    return out


def mark_used(path: Path) -> Path:
    """Record that a cache entry was served now, in its access time: its modification time is what an index's
    freshness is judged by, so it stays. Nothing is recorded for an entry not yet written, or a read-only cache."""
    try:
        st = os.stat(path, follow_symlinks=False)
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)
    except OSError:
        pass
    return path


@dataclass
class CacheEntry:
    """One thing the cache holds: a copy, a link or an index, with the indexes made beside it."""

    name: str  # the copy's, link's or index's name, without index suffixes
    files: list[Path]
    bytes: int  # on disk, of all its files (a link: the link itself)
    last_used: float  # seconds since the epoch: the latest use recorded, or the latest write
    kind: CacheKind


def cache_entries() -> list[CacheEntry]:
    """Every entry of the cache, by folder and name. A temp file a copy is being written to (or was, when its
    writer was killed) is "unfinished", dated by its last write."""
    root = cache_dir()
    groups: dict[tuple[str, str], list[Path]] = {}
    for part in PARTS:
        folder = root / part
        for f in sorted(folder.iterdir()) if folder.is_dir() else []:
            stem = next((f.name[: -len(x)] for x in BESIDE_SUFFIXES if f.name.endswith(x)), f.name)
            groups.setdefault((part, stem), []).append(f)
    return [e for (part, name), files in groups.items() if (e := _entry(part, name, files))]


def _entry(part: str, name: str, files: list[Path]) -> CacheEntry | None:
    """The entry of these files, or None when they are gone (a temp copy renamed to its name meanwhile)."""
    stats = []
    for f in list(files):
        try:
            stats.append(os.stat(f, follow_symlinks=False))
        except FileNotFoundError:
            files.remove(f)
    if not stats:
        return None
    size = sum(st.st_blocks * 512 for st in stats)
    if name.startswith(".") and name.endswith(".tmp"):
        return CacheEntry(name, files, size, max(st.st_mtime for st in stats), "unfinished")
    used = max(max(st.st_atime, st.st_mtime) for st in stats)
    main = files[0].with_name(name)
    kind: CacheKind
    if part == "links":
        kind = "link" if main.exists() else "link to a missing file"  # exists() follows the link
    else:
        kind = "index" if part == "index" else "normalized" if name.endswith(NORMALIZED) else "decompressed"
    return CacheEntry(name, files, size, used, kind)


def remove_unused(days: float) -> list[CacheEntry]:
    """Remove the entries of the cache not used for `days` days (0: all), and links whose file is gone; return
    them. An entry being read is safe: a file open when it is removed stays readable until closed."""
    cutoff = time.time() - days * 86400
    removed = [e for e in cache_entries() if e.last_used <= cutoff or e.kind == "link to a missing file"]
    for e in removed:
        for f in e.files:
            f.unlink(missing_ok=True)
    return removed
