"""A FASTA's .fai (a BGZF one's .gzi too) built from its line breaks with numpy, for the plain layout nearly every
genome has; anything else by pyfaidx's own builder's steps a line at a time (fai_lines), which judge it as before.

The index is the one pyfaidx writes, byte for byte: per record its name (the header's first word), its bases,
the offset of its first base, and the bases and bytes of its first line. Records are judged as pyfaidx judges
them: every line of the first line's length but the last, which may be shorter, then one blank line at most
(none with CRLF line ends, where pyfaidx's rules for it differ); the file's last line may be unended."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from lcft.files import atomic_open
from lcft.genomics.fai_lines import Row, index_rows

BLOCK = 1 << 24  # bytes read at a time: 16 MiB (its line offsets are a few MiB of int64)
PIECE = 1 << 20  # bytes a file of another layout is read at a time (fai_lines: a line is never held whole)
MAX_HEADER = 1 << 16  # a longer header line is left to fai_lines
LF, CR, GT = 10, 13, ord(">")


class _Misfit(Exception):
    """The file is not of the plain layout: fai_lines builds (and judges) its index as pyfaidx does."""


class _Records:
    """The index as the lines arrive, a block at a time: records closed within a block are judged together."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.names: set[str] = set()
        self.eol = 1  # bytes of each line end: 2 once the first is found to be CRLF
        self.name: str | None = None  # the record still open at a block's end
        self.offset = self.lenb = self.lenc = self.bases = 0
        self.short = False  # its last line so far was shorter than its first: only a blank line may follow
        self.blank = False  # its last line so far was blank: nothing may follow

    def _named(self, text: bytes) -> str:
        """The header's first word as pyfaidx splits it: as text (str.split also splits at \\x1c-\\x1f)."""
        words = text[1:].decode().split() if len(text) <= MAX_HEADER else []
        if not words or words[0] in self.names:
            raise _Misfit
        self.names.add(words[0])
        return words[0]

    def open(self, text: bytes, offset: int) -> None:
        """A header line whose record's first base would be at file offset `offset`."""
        self.name, self.offset, self.lenb, self.lenc, self.bases = self._named(text), offset, 0, 0, 0
        self.short = self.blank = False

    def lines(self, blen: np.ndarray) -> None:
        """More lines of the open record, in order (bytes each, line end included)."""
        if self.name is None or self.blank:  # before any header, or after the blank line ending a record
            raise _Misfit
        self.blank = self.eol == 1 and bool(blen[-1] == 1)
        body = blen[:-1] if self.blank else blen  # (k,)
        if not body.size:
            return
        if self.short or (body <= self.eol).any():  # a line after the short last one, or a blank line inside
            raise _Misfit
        if not self.lenb:
            self.lenb, self.lenc = int(body[0]), int(body[0]) - self.eol
        other = np.flatnonzero(body != self.lenb)  # (j,)
        if other.size > 1 or (other.size and (other[0] != body.size - 1 or body[-1] > self.lenb)):
            raise _Misfit  # only the record's last line may differ, and only be shorter
        self.short = bool(other.size)
        self.bases += int(body.sum()) - body.size * self.eol

    def unended(self, n: int) -> None:
        """The file's last line, `n` bytes without a line end: the open record's last line, as many bases as its
        first line's at most (pyfaidx counts them all; a longer one its index would not fit)."""
        if self.name is None or self.blank or self.short:
            raise _Misfit
        if not self.lenb:  # the record's only line: pyfaidx gives its bytes, n, as its bytes a line
            self.lenb = self.lenc = n
        elif n > self.lenc:
            raise _Misfit
        self.bases += n

    def close(self) -> None:
        if self.name is not None:
            if not self.lenb:  # a record without bases: pyfaidx's rows for those are its own
                raise _Misfit
            self.rows.append((self.name, self.bases, self.offset, self.lenc, self.lenb))
        self.name = None

    def closed(self, texts: list[bytes], offsets: list[int], blen: np.ndarray, heads: np.ndarray) -> None:
        """Whole records of one block at once: record j has the header line heads[j] and the lines up to
        heads[j + 1] (blen: bytes of every line of the block; texts and offsets: of each record's header)."""
        first, last = heads[:-1] + 1, heads[1:] - 1  # (r,) each record's first and last line
        eol = self.eol
        blank = (blen[last] == 1) & (eol == 1)  # (r,)
        body_last = last - blank  # (r,) its last line of bases
        size = blen[first]  # (r,) bytes of its first line
        if (body_last < first).any() or (size <= eol).any():  # a record without bases, or a blank line first
            raise _Misfit
        seq = np.ones(blen.size, dtype=bool)
        seq[heads] = False
        at = np.flatnonzero(seq[heads[0]:heads[-1]]) + heads[0]  # (s,) the records' lines of bases
        rec = np.searchsorted(heads, at) - 1  # (s,) the record of each
        b, want = blen[at], size[rec]  # (s,)
        fits = (b == want) | ((at == body_last[rec]) & (b < want) & (b > eol)) | (blank[rec] & (at == last[rec]))
        if not fits.all():
            raise _Misfit
        bases = np.concatenate(([0], np.cumsum(blen - eol)))  # (m+1,) a header's count is never in a record's span
        counts = bases[last + 1] - bases[first]  # (r,) blank lines add 0
        for text, offset, n, width in zip(texts, offsets, counts.tolist(), size.tolist(), strict=True):
            self.rows.append((self._named(text), n, offset, width - eol, width))


class _Scan:
    """The uncompressed file, fed a block at a time."""

    def __init__(self) -> None:
        self.records, self.tail, self.pos = _Records(), _Tail(), 0
        self.ends_known = False  # whether the first line end (LF or CRLF: all are then of its kind) was read
        self.cr_last = False  # the last block ended in a CR: the next must start with its LF

    def feed(self, block: bytes | bytearray) -> None:
        if not block:
            return
        arr = np.frombuffer(block, dtype=np.uint8)  # (n,)
        if arr.max() >= 0x80:
            raise _Misfit
        ends = np.flatnonzero(arr == LF) + self.pos  # (m,) file offsets of its LFs
        if self.cr_last or b"\r" in block:
            self._crlf(arr, ends)
        elif self.records.eol == 2 and ends.size:  # an LF alone in a CRLF file
            raise _Misfit
        if ends.size and not self.ends_known:
            self.ends_known = True
        if self.records.eol == 2 and ends.size and (np.diff(ends, prepend=self.tail.at - 1) == 2).any():
            raise _Misfit  # a blank line (CRLF): pyfaidx's rules for those are its own
        _block_lines(self.records, self.tail, block, self.pos, ends)
        self.pos += len(block)

    def _crlf(self, arr: np.ndarray, ends: np.ndarray) -> None:
        """Carriage returns are only the first half of every line end, the file's first line end a CRLF."""
        crs = np.flatnonzero(arr == CR) + self.pos + 1  # (k,) where each CR's LF must be
        if self.cr_last:
            crs = np.concatenate(([self.pos], crs))
        self.cr_last = bool(crs.size) and crs[-1] == self.pos + arr.size
        if self.cr_last:
            crs = crs[:-1]
        if not self.ends_known and ends.size:
            self.records.eol = 2 if crs.size and crs[0] == ends[0] else 1
        if (self.records.eol == 1 and crs.size) or not np.array_equal(crs, ends if self.records.eol == 2 else crs):
            raise _Misfit

    def rows(self) -> list[Row]:
        if self.pos == 0 or self.cr_last:  # empty, or a CR last
            raise _Misfit
        if self.tail.at != self.pos:  # a last line without its line end
            if self.tail.first == GT:  # a header: a record without bases
                raise _Misfit
            self.records.unended(self.pos - self.tail.at)
        self.records.close()
        return self.records.rows


def build_fai(fasta: Path, fai: Path) -> None:
    """Write `fai` as pyfaidx writes it for `fasta` (uncompressed), or raise pyfaidx's error for it: with numpy for
    the plain layout (a header first, LF or CRLF line ends, ASCII only, records judged as pyfaidx judges them, each
    named and with bases, names unique), else a line at a time (fai_lines)."""
    scan = _Scan()
    buf = bytearray(BLOCK)  # reused: a fresh buffer per block costs its page faults (half the read's time)
    try:
        with open(fasta, "rb", buffering=0) as fh:
            while got := fh.readinto(buf):
                scan.feed(buf if got == BLOCK else buf[:got])
        rows = scan.rows()
    except _Misfit:
        rows = index_rows(str(fasta), _pieces(fasta))
    _write_fai(fai, rows)


def _pieces(fasta: Path) -> Iterator[bytes]:
    with open(fasta, "rb") as fh:
        while data := fh.read(PIECE):
            yield data


def _bgzf_blocks(fh: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each block of a BGZF file: (its compressed start, its data); _Misfit at one that is not of the standard
    header, or whose CRC or size does not match."""
    while head := fh.read(18):
        if len(head) < 18 or head[:4] != b"\x1f\x8b\x08\x04" or head[10:16] != b"\x06\x00BC\x02\x00":
            raise _Misfit
        rest = fh.read(struct.unpack_from("<H", head, 16)[0] + 1 - 18)
        crc, size = struct.unpack_from("<II", rest, len(rest) - 8) if len(rest) >= 8 else (0, -1)
        data = zlib.decompress(rest[:-8], -15) if size >= 0 else b""
        if len(data) != size or zlib.crc32(data) != crc:
            raise _Misfit
        yield fh.tell() - len(head) - len(rest), data


def build_bgzf_index(fasta: Path, fai: Path, gzi: Path) -> bool:
    """Write `fai` and `gzi` as pyfaidx writes them when `fasta` is BGZF (every block of the standard header, its
    CRC and size checked, the empty end-of-file block last): the .fai of what it holds as `build_fai` writes it (or
    pyfaidx's error for it), the .gzi each block's (compressed, uncompressed) start but the first's and the
    end-of-file block's. False, writing nothing, for any other file (pyfaidx then judges it: a damaged block is
    its error)."""
    scan: _Scan | None = _Scan()
    starts, pending, ustart, held = [], [], 0, 0
    try:
        with open(fasta, "rb") as fh:
            for cstart, data in _bgzf_blocks(fh):
                starts.append((cstart, ustart))
                ustart, held = ustart + len(data), held + len(data)
                pending.append(data)
                if held >= BLOCK:  # scanned 16 MiB at a time, as a plain file is
                    scan = _fed(scan, b"".join(pending))
                    pending, held = [], 0
        scan = _fed(scan, b"".join(pending))
        if len(starts) < 2 or starts[-1][1] != ustart:  # the last block is the empty end-of-file one
            raise _Misfit
    except (_Misfit, zlib.error):
        return False
    try:
        rows = scan.rows() if scan else None
    except _Misfit:
        rows = None
    if rows is None:  # sound blocks of another layout: read again, a block at a time
        with open(fasta, "rb") as fh:
            rows = index_rows(str(fasta), (data for _, data in _bgzf_blocks(fh)))
    with atomic_open(gzi, "wb") as out:
        out.write(struct.pack("<Q", len(starts) - 2) + b"".join(struct.pack("<QQ", *s) for s in starts[1:-1]))
    _write_fai(fai, rows)
    return True


def _fed(scan: _Scan | None, data: bytes) -> _Scan | None:
    """`scan` fed `data`; None once the file is found of another layout (its blocks are still checked)."""
    if scan is not None:
        try:
            scan.feed(data)
        except _Misfit:
            return None
    return scan


def _write_fai(fai: Path, rows: list[Row]) -> None:
    with atomic_open(fai, "w") as out:
        out.writelines(f"{n}\t{b}\t{o}\t{c}\t{w}\n" for n, b, o, c, w in rows)


class _Tail:
    """The line not ended yet at a block's end: where it starts, its first byte, its text if a header."""

    def __init__(self) -> None:
        self.at, self.first, self.text = 0, -1, b""  # first: -1 until its first byte is read

    def extend(self, block: bytes | bytearray, pos: int) -> None:
        """The rest of `block` (from file offset `pos`) belongs to it."""
        rest = block[max(self.at - pos, 0):]
        if self.first < 0 and rest:
            self.first = rest[0]
        if self.first == GT:
            self.text += bytes(rest)
            if len(self.text) > MAX_HEADER:
                raise _Misfit


def _block_lines(records: _Records, tail: _Tail, block: bytes | bytearray, pos: int, ends: np.ndarray) -> None:
    """The lines that end in this block (`ends`: file offsets of their LFs), the first begun maybe earlier."""
    if not ends.size:
        tail.extend(block, pos)
        return
    starts = np.concatenate(([tail.at], ends[:-1] + 1))  # (m,)
    first = np.frombuffer(block, dtype=np.uint8)[np.maximum(starts - pos, 0)]  # (m,) first bytes
    if tail.at < pos:  # the first line began in an earlier block
        first[0] = tail.first
    heads = np.flatnonzero(first == GT)  # (h,) header lines
    blen = ends - starts + 1  # (m,) bytes of each line, LF included
    if not heads.size or heads[0]:
        records.lines(blen[: heads[0] if heads.size else ends.size])  # the open record goes on
    if heads.size:
        records.close()
        texts = [tail.text + block[:e - pos] if s < pos else bytes(block[s - pos:e - pos])
                 for s, e in zip(starts[heads].tolist(), ends[heads].tolist(), strict=True)]
        offsets = (ends[heads] + 1).tolist()
        if heads.size > 1:
            records.closed(texts[:-1], offsets[:-1], blen, heads)
        records.open(texts[-1], offsets[-1])
        if heads[-1] + 1 < ends.size:
            records.lines(blen[heads[-1] + 1:])
    tail.at, tail.first, tail.text = int(ends[-1]) + 1, -1, b""
    tail.extend(block, pos)
