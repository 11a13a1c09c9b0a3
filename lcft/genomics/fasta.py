"""FASTA access through pyfaidx: input checks with one-line errors, chromosome list, streamed raw chunks."""

from __future__ import annotations

import bisect
import gzip
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pyfaidx

from lcft.errors import LcftError, reason, shown
from lcft.files import file_hash
from lcft.genomics.fai_build import build_bgzf_index, build_fai
from lcft.genomics.fasta_cache import (
    NORMALIZED,
    decompress_to_cache,
    gzip_kind,
    index_paths,
    named_for_pyfaidx,
    normalize_to_cache,
)
from lcft.genomics.fasta_check import (
    BLANKS,
    fai_parses,
    first_non_base,
    gzi_fits,
    indexing_error,
    missing_names_error,
    non_ascii_line,
    not_a_fasta_file,
)
from lcft.genomics.fasta_scan import MAX_GAP, IndexScan, long_header, scan_index

PIECE_BYTES = 1 << 18  # whole lines per read: 256 KiB stays in L2 through translate and copy


def _first_text(path: Path, kind: str, n: int = 1 << 16, most: int = 1 << 24) -> bytes:
    """The file's first `n` bytes (decompressed), read on until they hold a line break (a header can be longer
    than `n`: what ends it decides how pyfaidx must be given the file), at most `most`."""
    try:
        with open(path, "rb") if kind == "plain" else gzip.open(path, "rb") as fh:
            parts = [fh.read(n)]
            while len(parts) * n < most and not re.search(rb"[\r\n]", parts[-1]) and (more := fh.read(n)):
                parts.append(more)
            return b"".join(parts)
    except (OSError, EOFError) as e:
        raise LcftError(f"{path}: not a readable FASTA ({reason(e)})") from None


def check_fasta(path: str | os.PathLike, sha256: Callable[[], str]) -> tuple[Path, Path, str]:
    """Validate a FASTA path before anything is written. Returns (given path, path pyfaidx reads, gzip kind).

    Plain gzip is decompressed into the cache (see `decompress_to_cache`); BGZF is read in place. sha256: the
    file's digest, asked for only when a copy in the cache is named by it."""
    p = Path(path)
    if not p.exists():
        raise LcftError(f"FASTA not found: {p}")
    if (why := not_a_fasta_file(p)) is not None:
        raise why
    if p.stat().st_size == 0:
        raise LcftError(f"empty FASTA: {p} has no bytes")
    kind = gzip_kind(p)
    head = _first_text(p, kind)
    body = [ln.strip() for ln in head.splitlines()]
    body = [ln for ln in body if ln and not ln.startswith(b";")]
    if not body:
        raise LcftError(f"empty FASTA: {p} has no records")
    if not body[0].startswith(b">"):
        shown = body[0][:40].decode("ascii", "replace")
        raise LcftError(f"not a FASTA file: {p} (first line {shown!r} does not start with '>')")
    if re.search(rb"\r(?!\n)", head.rstrip(b"\r")):  # CR-only line ends: pyfaidx would see one line
        return p, normalize_to_cache(p, kind, sha256()), kind
    readable = decompress_to_cache(p, sha256()) if kind == "gzip" else named_for_pyfaidx(p, kind)
    return p, readable, kind


def _not_a_file(path: Path) -> bool:
    """Something other than a regular file under an index's name (a FIFO would block pyfaidx's read forever, a
    link to /dev/zero fill memory): never read, built again."""
    return os.path.lexists(path) and not path.is_file()


class FastaFile:
    """A FASTA opened through pyfaidx's index: names, lengths and raw (line-broken) byte ranges."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._sha256: str | None = None
        self._hashing: Future[str] | None = None
        self.path, self.readable, self.kind = check_fasta(self.path, self.sha256)
        try:
            self.faidx = self._index()
        except pyfaidx.FastaIndexingError as e:
            # Blank lines, which pyfaidx tolerates only in some places (not with CRLF line ends): retry on a
            # normalized copy; if that fails too, the original error (with the file's own line numbers) stands.
            if self.readable.name.endswith(NORMALIZED):
                raise self._explained(indexing_error(self.path, e)) from None
            self.readable = normalize_to_cache(self.path, self.kind, self.sha256())
            try:
                self.faidx = self._index()
            except pyfaidx.FastaIndexingError:
                raise self._explained(indexing_error(self.path, e)) from None
        self._adopt()
        found = self._scan_reused()
        if found.mismatch and self._reused:  # an index newer than its FASTA that no longer describes it
            self.faidx.close()
            self.faidx = self._index(stale=True)
            self._adopt()
            found = scan_index(self)
        if found.blanks and not self.readable.name.endswith(NORMALIZED):  # pyfaidx counted the blanks as bases
            self.faidx.close()
            self.readable = normalize_to_cache(self.path, self.kind, self.sha256())
            try:
                self.faidx = self._index()
            except pyfaidx.FastaIndexingError:  # blanks ended some lines of a record, stood for bases in others
                raise LcftError(
                    f"{self.path}: its sequence lines are of unequal length once the spaces and tabs ending some "
                    f"of them (first in record {shown(found.blanks, quoted=True)}) are dropped, as Biopython drops "
                    "them; remove blanks from the sequence lines, e.g. `sed '/^>/!s/[[:blank:]]//g' in.fa > "
                    "out.fa`, and re-wrap them, e.g. `seqkit seq -w 60`") from None
            self._adopt()
            found = scan_index(self)
        if found.mismatch:  # pyfaidx's own index does not fit the file: it checks line lengths in bytes only
            if (name := long_header(self.index)) is not None:
                self.close()
                raise LcftError(f"{self.path}: the header line of record {shown(name, quoted=True)} is over "
                                f"{MAX_GAP >> 20} MiB long (not read); shorten it, e.g. `sed '/^>/s/ .*//'`")
            self.close()
            raise self._explained(LcftError(
                f"{self.path}: its records are not laid out as their first lines say ({found.mismatch}): a "
                "record's last line longer than its others does this, or a line with another line end (CRLF among "
                "LF) and a base less; re-wrap the file, e.g. `seqkit seq -w 60`"))
        if not self.index:
            self.close()
            raise LcftError(f"empty FASTA: {self.path} has no sequence records")

    def _explained(self, refusal: LcftError) -> LcftError:
        """`refusal` of the file's layout, unless a letter of several bytes among the bases is its cause (pyfaidx
        counts it as one character, so no re-wrap would help): then that, naming the line."""
        line = non_ascii_line(self.path)
        if line is None:
            return refusal
        return LcftError(f"{self.path}: line {line} holds a non-ASCII character among bases; a FASTA's sequence "
                         "lines are ASCII letters (IUPAC codes): fix or remove it")

    def _scan_reused(self) -> IndexScan:
        """scan_index of the index as opened: one reused from beside the file through which a read fails (a .gzi
        start inside a block, of a size the file can have) does not describe the file, which may be sound; a read
        that fails through a fresh index is the file's fault and stays an error."""
        try:
            return scan_index(self)
        except LcftError:
            if not self._reused:
                raise
            return IndexScan("a read through it fails", None)

    def _adopt(self) -> None:
        """Read what the open index says (again, after a rebuild)."""
        self.index = self.faidx.index
        self.indexname = Path(self.faidx.indexname)
        gzi = getattr(self.faidx, "gzi_index", None) or []
        self._gzi_ustarts = [b.ustart for b in gzi]

    def _index(self, stale: bool = False) -> pyfaidx.Faidx:
        """pyfaidx's index of the readable file; stale: the existing one is removed and built again. A gzip
        that only starts as BGZF is then read as a plain gzip is: from its decompressed copy."""
        read_kind = "bgzf" if self.readable.name.endswith((".gz", ".bgz")) else "plain"
        paths = index_paths(self.readable, read_kind, stale)
        fai = Path(paths.get("indexname", str(self.readable) + ".fai"))
        gzi = Path(paths.get("gzi_indexname", str(self.readable) + ".gzi"))
        if stale:
            for index in (fai, gzi):
                try:
                    index.unlink(missing_ok=True)
                except OSError as e:  # a folder under the index's name
                    raise LcftError(f"{index}: cannot replace this index of {self.path} ({e.strerror}); remove "
                                    "it") from None
        elif (_not_a_file(fai) or (fai.is_file() and not fai_parses(fai))
              or (read_kind == "bgzf" and (_not_a_file(gzi) or (gzi.is_file() and not gzi_fits(gzi, self.readable))))):
            return self._index(stale=True)  # an index that cannot describe the file: pyfaidx reads it as is
        self._reused = fai.is_file()  # pyfaidx keeps an index newer than the file without reading the file
        if not self._reused:  # the plain layout, several times faster than pyfaidx; anything else is pyfaidx's
            build_fai(self.readable, fai) if read_kind == "plain" else build_bgzf_index(self.readable, fai, gzi)
        try:
            return pyfaidx.Faidx(str(self.readable), duplicate_action="stop", **paths)
        except pyfaidx.UnsupportedCompressionFormat as e:
            raise self._explained(indexing_error(self.path, e)) from None
        except ValueError as e:
            if "Duplicate key" in str(e):  # pyfaidx: 'Duplicate key "chr1"'
                raise LcftError(f"{self.path}: {reason(e)} (record names must be unique)") from None
            if read_kind != "bgzf":
                raise LcftError(f"{self.path}: pyfaidx cannot index this FASTA: {reason(e)}") from None
            # Bio.bgzf: a member that is not BGZF (`cat a.fa.bgz b.fa.gz`): gzip, read at random only once
            # decompressed, as Biopython reads it whole
            self.kind, self.readable = "gzip", decompress_to_cache(self.path, self.sha256())
            return self._index()
        except RuntimeError as e:  # pyfaidx: "Unhandled exception during fasta indexing" (odd line lengths)
            raise self._explained(indexing_error(self.path, e)) from None
        except OSError as e:
            raise LcftError(f"{self.path}: cannot index FASTA: {reason(e)}") from None
        except (struct.error, zlib.error, EOFError) as e:  # Bio.bgzf on a cut or damaged block
            raise LcftError(f"{self.path}: truncated or corrupt BGZF ({e or type(e).__name__})") from None

    @contextmanager
    def _reading(self, name: str = "") -> Iterator[None]:
        """Reads (of record `name`): a cut or damaged BGZF block (Bio.bgzf raises struct, zlib, EOF and value
        errors) is a one-line error naming the file."""
        errors = (struct.error, zlib.error, EOFError) + ((ValueError,) if self.faidx._bgzf else ())
        try:
            yield
        except errors as e:
            inside = f" inside {name}" if name else ""
            raise LcftError(f"{self.path}: truncated or corrupt BGZF{inside} ({e or type(e).__name__})") from None

    def __enter__(self) -> FastaFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.faidx.close()

    @property
    def names(self) -> list[str]:
        return list(self.index)

    def length(self, name: str) -> int:
        return self.index[name].rlen

    def sha256(self) -> str:
        """sha256 of the FASTA file as given (compressed bytes for .gz): what its windows are cut from. Read
        once per open: it also names the copy in the cache that a plain gzip or a normalized file is read from,
        so the manifest's digest is the one of the bytes read."""
        if self._sha256 is None:
            try:
                self._sha256 = self._hashing.result() if self._hashing else file_hash(self.path).hexdigest()
            except OSError as e:  # (on a thread: gone or unreadable since it was opened)
                raise LcftError(f"{self.path}: cannot read it to hash it ({reason(e)})") from None
        return self._sha256

    def hash_in_background(self) -> None:
        """Start `sha256` on a thread, for a caller with other work to do before it needs the digest (reading the
        file and hashing it release the GIL)."""
        if self._sha256 is None and self._hashing is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="lcft-fasta-sha256")
            self._hashing = pool.submit(lambda: file_hash(self.path).hexdigest())
            pool.shutdown(wait=False)  # the thread ends with its one task

    def require(self, names: list[str] | tuple[str, ...]) -> None:
        """Every name must be a record of this FASTA; the error lists what is there."""
        missing = [n for n in names if n not in self.index]
        if missing:
            raise missing_names_error(self.path, missing, self.names)

    def _byte_offset(self, name: str, pos: int) -> int:
        rec = self.index[name]
        if rec.lenc == 0:
            return rec.offset
        return rec.offset + (pos // rec.lenc) * rec.lenb + pos % rec.lenc

    def read_at(self, b0: int, n: int) -> bytes:
        """Up to n bytes of the (uncompressed) file from byte b0: fewer at its end."""
        with self._reading():
            if not self.faidx._bgzf:
                return os.pread(self.faidx.file.fileno(), n, b0)
            self.faidx.file.seek(self._virtual_offset(b0))
            return self.faidx.file.read(n)

    def _seek_offset(self, name: str, pos: int) -> int:
        """Where to seek the open file for base `pos`: the byte offset, or a BGZF virtual offset."""
        return self._virtual_offset(self._byte_offset(name, pos))

    def _virtual_offset(self, b0: int) -> int:
        """Where to seek the open file for uncompressed byte b0: b0, or its BGZF virtual offset."""
        if not self.faidx._bgzf:
            return b0
        from Bio.bgzf import make_virtual_offset

        # the block holding uncompressed offset b0 (.gzi lists each block's start), then the offset in it
        block = self.faidx.gzi_index[max(bisect.bisect_right(self._gzi_ustarts, b0) - 1, 0)]
        return make_virtual_offset(block.cstart, b0 - block.ustart)

    def read_raw(self, name: str, start: int, end: int) -> bytes:
        """Bytes of bases [start, end) of record `name` as stored (line breaks included, case kept)."""
        rec = self.index[name]
        if not 0 <= start <= end <= rec.rlen:
            raise LcftError(f"{name}:{start}-{end} is outside the record (length {rec.rlen})")
        if start == end:
            return b""
        b0 = self._byte_offset(name, start)
        b1 = self._byte_offset(name, end - 1) + 1
        fh = self.faidx.file
        with self._reading(name):
            fh.seek(self._seek_offset(name, start))
            data = fh.read(b1 - b0)
        if len(data) != b1 - b0:
            raise LcftError(f"{self.path}: file ends early inside {name} (truncated or changed since indexing)")
        self._bases_only(name, data, b0)
        return data

    def _bases_only(self, name: str, data: bytes | bytearray, b0: int, rows: int = 0) -> None:
        """`data`, bytes of record `name` from byte b0 (`rows` whole lines, or a fragment ending at a base),
        holds bases where the index puts bases: no space or tab (pyfaidx counts one as a base, Biopython drops
        it) and no line that ends otherwise than the record's first in as many bytes (pyfaidx takes a carriage
        return for a base, or a base for a line break). Every later base would be read one place off. Costs two
        or three memchr passes (about 0.03 ns a byte); a CRLF record's carriage returns are counted (0.3 ns).
        (Blanks ending a record's first or last line were seen at open: the file is then read from a copy.)"""
        rec = self.index[name]
        crs = rec.lenb - rec.lenc - 1  # carriage returns ending each line: 0 (LF) or 1 (CRLF)
        if b" " not in data and b"\t" not in data and (
                b"\r" not in data if crs <= 0 else data.count(b"\r") == crs * (rows or data.count(b"\n"))):
            return
        base, found = first_non_base(data, b0 - rec.offset, rec.lenc, rec.lenb)
        if found in BLANKS.values():
            fix = "remove blanks from the sequence lines, e.g. `sed '/^>/!s/[[:blank:]]//g' in.fa > out.fa`"
        else:
            fix = "give every line one kind of line end, e.g. `dos2unix in.fa`"
        raise LcftError(f"{self.path}: record {shown(name, quoted=True)} has {found} (at base {base + 1:,}), "
                        f"which pyfaidx reads as bases otherwise than Biopython; {fix}")

    def line_pieces(
        self, name: str, start: int, end: int, piece_bytes: int = PIECE_BYTES
    ) -> Iterator[tuple[bytes | bytearray, int]]:
        """Bases [start, end) of record `name` as stored, in pieces of about `piece_bytes`: (data, rows).

        rows > 0: `data` is `rows` whole lines of the record, each `line_bytes(name)` long with the first
        `length of a line` bytes bases and the rest the line break, so a caller can drop the breaks by
        position (a strided copy) rather than by value. rows == 0: a fragment inside one line (the first
        and last piece), line breaks included where they fall. Pieces of a plain file are read into one
        reused buffer: use each before drawing the next."""
        rec = self.index[name]
        if not 0 <= start <= end <= rec.rlen:
            raise LcftError(f"{name}:{start}-{end} is outside the record (length {rec.rlen})")
        lenc, lenb = rec.lenc, rec.lenb
        if lenc == 0 or end - start <= 2 * lenc:  # short range: fragments only
            if end > start:
                yield self.read_raw(name, start, end), 0
            return
        first = -(-start // lenc)  # first line that starts at or after `start`
        last = end // lenc if end < rec.rlen else (end - 1) // lenc  # the record's last line may lack its break
        if start < first * lenc:
            yield self.read_raw(name, start, first * lenc), 0
        per = max(1, piece_bytes // lenb)
        fd = None if self.faidx._bgzf else self.faidx.file.fileno()
        if fd is None:  # BGZF: sequential reads from the block holding the first whole line
            with self._reading(name):
                self.faidx.file.seek(self._seek_offset(name, first * lenc))
        else:  # plain: positioned reads into one buffer
            buf = bytearray(min(per, max(last - first, 1)) * lenb)
        for line in range(first, last, per):
            rows = min(per, last - line)
            want = rows * lenb
            if fd is None:
                with self._reading(name):
                    data: bytes | bytearray = self.faidx.file.read(want)
            else:
                view = buf if want == len(buf) else bytearray(want)
                data = view if os.preadv(fd, [view], rec.offset + line * lenb) == want else b""
            if len(data) != want:
                raise LcftError(f"{self.path}: file ends early inside {name} (truncated or changed since indexing)")
            self._bases_only(name, data, rec.offset + line * lenb, rows)
            yield data, rows
        if last * lenc < end:
            yield self.read_raw(name, last * lenc, end), 0

    def line_bytes(self, name: str) -> tuple[int, int]:
        """(bases per line, bytes per line including the line break) of record `name`."""
        rec = self.index[name]
        return rec.lenc, rec.lenb

    def chunks(self, name: str, chunk: int = 1 << 23) -> Iterator[tuple[int, bytes]]:
        """(start, raw bytes) pieces of about `chunk` bases covering the whole record, in order."""
        n = self.length(name)
        for s in range(0, n, chunk):
            yield s, self.read_raw(name, s, min(s + chunk, n))


SAMPLE_NAME = "human_sample.fa.gz"


def sample_fasta() -> Path:
    """The bundled demo FASTA (BGZF; records chr2 = hg38 chr2:1-2,333,275 and chr22 = GRCh37
    chr22:20,000,001-21,000,000; see lcft/data/sample/README.md). Its .fai/.gzi ship beside it; when the
    package folder is read-only and they are stale, FastaFile puts fresh ones in the cache."""
    path = Path(__file__).resolve().parent.parent / "data" / "sample" / SAMPLE_NAME
    if not path.is_file():
        raise LcftError(f"bundled sample missing: {path} (broken install?)")
    return path
