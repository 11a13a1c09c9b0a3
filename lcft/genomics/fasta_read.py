"""Reads of an open FASTA's records through its pyfaidx index: raw byte ranges, whole-line pieces and chunks, each
checked to hold bases where the index puts them."""

from __future__ import annotations

import bisect
import gzip
import os
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyfaidx

from lcft.errors import LcftError, shown
from lcft.genomics.fasta_check import (
    BLANKS,
    JOINED_HEADER,
    NORMALIZED,
    first_non_base,
    joined_header,
    missing_names_error,
)

PIECE_BYTES = 1 << 18  # whole lines per read: 256 KiB stays in L2 through translate and copy
# What a read of gzip data raises where the file is cut or damaged: gzip.BadGzipFile (an OSError) for a bad
# header, EOFError for a stream cut short, zlib.error for damaged deflate data (neither of the last two an OSError)
GZIP_DAMAGE = (gzip.BadGzipFile, EOFError, zlib.error)
BGZF_DAMAGE = (struct.error, *GZIP_DAMAGE)  # Bio.bgzf's block reader: also struct.error for a cut block header


class FastaRecords:
    """Names, lengths and raw (line-broken) byte ranges of a FASTA's records: a base of FastaFile
    (lcft.genomics.fasta), which opens and checks the file and sets what these read."""

    path: Path
    readable: Path  # the file pyfaidx indexed: `path`, a link to it, or a decompressed or normalized copy
    faidx: pyfaidx.Faidx
    index: dict[str, pyfaidx.IndexRecord]
    _gzi_ustarts: list[int]

    @contextmanager
    def _reading(self, name: str = "") -> Iterator[None]:
        """Reads (of record `name`): a cut or damaged BGZF block (Bio.bgzf raises struct, zlib, EOF and value
        errors) is a one-line error naming the file."""
        errors = BGZF_DAMAGE + ((ValueError,) if self.faidx._bgzf else ())
        try:
            yield
        except errors as e:
            inside = f" inside {name}" if name else ""
            raise LcftError(f"{self.path}: truncated or corrupt BGZF{inside} ({e or type(e).__name__})") from None

    @property
    def names(self) -> list[str]:
        return list(self.index)

    def length(self, name: str) -> int:
        return self.index[name].rlen

    def require(self, names: list[str] | tuple[str, ...]) -> None:
        """Every name must be a record of this FASTA; the error lists what is there."""
        missing = [n for n in names if n not in self.index]
        if missing:
            # the bytes indexed: a gzip's decompressed copy is read without inflating it again; a normalized copy
            # (blank lines dropped) is not, so that a line named is the file's own
            source = self.path if self.readable.name.endswith(NORMALIZED) else self.readable
            raise missing_names_error(self.path, missing, self.names, source)

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
        it), no '>' (a header joined to the line before it, where its line is as long as the record's others:
        pyfaidx reads the next record's name and bases as this one's) and no line that ends otherwise than the
        record's first in as many bytes (pyfaidx takes a carriage return for a base, or a base for a line break).
        Every later base would be read one place off. Costs three or four memchr passes (about 0.03 ns a byte); a
        CRLF record's carriage returns are counted (0.3 ns). (Blanks ending a record's first or last line were seen
        at open: the file is then read from a copy.)"""
        rec = self.index[name]
        crs = rec.lenb - rec.lenc - 1  # carriage returns ending each line: 0 (LF) or 1 (CRLF)
        if b" " not in data and b"\t" not in data and b">" not in data and (
                b"\r" not in data if crs <= 0 else data.count(b"\r") == crs * (rows or data.count(b"\n"))):
            return
        base, found = first_non_base(data, b0 - rec.offset, rec.lenc, rec.lenb)
        if found == JOINED_HEADER:
            raise joined_header(self.path, f"record {shown(name, quoted=True)} (at base {base + 1:,})")
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
