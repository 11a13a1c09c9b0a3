"""A FASTA's .fai (a BGZF one's .gzi too) built from its line breaks with numpy, for the plain layout nearly every
genome has; anything else is left to pyfaidx's own builder (Python, one line at a time), which judges it as before.

The index is the one pyfaidx writes, byte for byte: per record its name (the header's first word), its bases,
the offset of its first base, and the bases and bytes of its first line. Records are judged as pyfaidx judges
them: every line of the first line's length but the last, which may be shorter, then one blank line at most."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from lcft.files import atomic_open

BLOCK = 1 << 24  # bytes read at a time: 16 MiB (its line offsets are a few MiB of int64)
MAX_HEADER = 1 << 16  # a longer header line is left to pyfaidx
LF, GT = 10, ord(">")


class _Misfit(Exception):
    """The file is not of the plain layout: pyfaidx builds (and judges) its index."""


class _Records:
    """The index as the lines arrive, a block at a time: records closed within a block are judged together."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int, int, int]] = []  # (name, bases, offset, bases/line, bytes/line)
        self.names: set[str] = set()
        self.name: str | None = None  # the record still open at a block's end
        self.offset = self.lenb = self.bases = 0
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
        self.name, self.offset, self.lenb, self.bases = self._named(text), offset, 0, 0
        self.short = self.blank = False

    def lines(self, blen: np.ndarray) -> None:
        """More lines of the open record, in order (bytes each, LF included)."""
        if self.name is None or self.blank:  # before any header, or after the blank line ending a record
            raise _Misfit
        self.blank = bool(blen[-1] == 1)
        body = blen[:-1] if self.blank else blen  # (k,)
        if not body.size:
            return
        if self.short or (body < 2).any():  # a line after the short last one, or a blank line inside
            raise _Misfit
        if not self.lenb:
            self.lenb = int(body[0])
        other = np.flatnonzero(body != self.lenb)  # (j,)
        if other.size > 1 or (other.size and (other[0] != body.size - 1 or body[-1] > self.lenb)):
            raise _Misfit  # only the record's last line may differ, and only be shorter
        self.short = bool(other.size)
        self.bases += int(body.sum()) - body.size

    def close(self) -> None:
        if self.name is not None:
            if not self.lenb:  # a record without bases: pyfaidx's rows for those are its own
                raise _Misfit
            self.rows.append((self.name, self.bases, self.offset, self.lenb - 1, self.lenb))
        self.name = None

    def closed(self, texts: list[bytes], offsets: list[int], blen: np.ndarray, heads: np.ndarray) -> None:
        """Whole records of one block at once: record j has the header line heads[j] and the lines up to
        heads[j + 1] (blen: bytes of every line of the block; texts and offsets: of each record's header)."""
        first, last = heads[:-1] + 1, heads[1:] - 1  # (r,) each record's first and last line
        blank = blen[last] == 1  # (r,)
        body_last = last - blank  # (r,) its last line of bases
        size = blen[first]  # (r,) bytes of its first line
        if (body_last < first).any() or (size < 2).any():  # a record without bases, or a blank line first
            raise _Misfit
        seq = np.ones(blen.size, dtype=bool)
        seq[heads] = False
        at = np.flatnonzero(seq[heads[0]:heads[-1]]) + heads[0]  # (s,) the records' lines of bases
        rec = np.searchsorted(heads, at) - 1  # (s,) the record of each
        b, want = blen[at], size[rec]  # (s,)
        fits = (b == want) | ((at == body_last[rec]) & (b < want) & (b >= 2)) | (blank[rec] & (at == last[rec]))
        if not fits.all():
            raise _Misfit
        bases = np.concatenate(([0], np.cumsum(blen - 1)))  # (m+1,) a header's count is never in a record's span
        counts = bases[last + 1] - bases[first]  # (r,) blank lines add 0
        for text, offset, n, width in zip(texts, offsets, counts.tolist(), size.tolist(), strict=True):
            self.rows.append((self._named(text), n, offset, width - 1, width))


class _Scan:
    """The uncompressed file, fed a block at a time."""

    def __init__(self) -> None:
        self.records, self.tail, self.pos = _Records(), _Tail(), 0

    def feed(self, block: bytes | bytearray) -> None:
        if not block:
            return
        arr = np.frombuffer(block, dtype=np.uint8)  # (n,)
        if b"\r" in block or arr.max() >= 0x80:
            raise _Misfit
        _block_lines(self.records, self.tail, block, self.pos, np.flatnonzero(arr == LF) + self.pos)
        self.pos += len(block)

    def rows(self) -> list[tuple[str, int, int, int, int]]:
        if self.pos == 0 or self.tail.at != self.pos:  # empty, or a last line without its LF
            raise _Misfit
        self.records.close()
        return self.records.rows


def build_fai(fasta: Path, fai: Path) -> bool:
    """Write `fai` as pyfaidx writes it when `fasta` (uncompressed) is of the plain layout: a header first, LF
    line ends, ASCII only, records judged as pyfaidx judges them, each named and with bases, names unique, the
    last line ended. False, writing nothing, for any other file."""
    scan = _Scan()
    buf = bytearray(BLOCK)  # reused: a fresh buffer per block costs its page faults (half the read's time)
    try:
        with open(fasta, "rb", buffering=0) as fh:
            while got := fh.readinto(buf):
                scan.feed(buf if got == BLOCK else buf[:got])
        rows = scan.rows()
    except _Misfit:
        return False
    _write_fai(fai, rows)
    return True


def build_bgzf_index(fasta: Path, fai: Path, gzi: Path) -> bool:
    """Write `fai` and `gzi` as pyfaidx writes them when `fasta` is BGZF (every block of the standard header, its
    CRC and size checked, the empty end-of-file block last) of a plain layout: the .fai of what it holds, the .gzi
    each block's (compressed, uncompressed) start but the first's and the end-of-file block's. False, writing
    nothing, for any other file (pyfaidx then judges it: a damaged block is its error)."""
    scan, starts, pending, ustart, held = _Scan(), [], [], 0, 0
    try:
        with open(fasta, "rb") as fh:
            while head := fh.read(18):
                if len(head) < 18 or head[:4] != b"\x1f\x8b\x08\x04" or head[10:16] != b"\x06\x00BC\x02\x00":
                    raise _Misfit
                rest = fh.read(struct.unpack_from("<H", head, 16)[0] + 1 - 18)
                crc, size = struct.unpack_from("<II", rest, len(rest) - 8) if len(rest) >= 8 else (0, -1)
                data = zlib.decompress(rest[:-8], -15) if size >= 0 else b""
                if len(data) != size or zlib.crc32(data) != crc:
                    raise _Misfit
                starts.append((fh.tell() - len(head) - len(rest), ustart))
                ustart, held = ustart + size, held + size
                pending.append(data)
                if held >= BLOCK:  # scanned 16 MiB at a time, as a plain file is
                    scan.feed(b"".join(pending))
                    pending, held = [], 0
        scan.feed(b"".join(pending))
        rows = scan.rows()
        if len(starts) < 2 or starts[-1][1] != ustart:  # the last block is the empty end-of-file one
            raise _Misfit
    except (_Misfit, zlib.error):
        return False
    with atomic_open(gzi, "wb") as out:
        out.write(struct.pack("<Q", len(starts) - 2) + b"".join(struct.pack("<QQ", *s) for s in starts[1:-1]))
    _write_fai(fai, rows)
    return True


def _write_fai(fai: Path, rows: list[tuple[str, int, int, int, int]]) -> None:
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
