"""Whether a FASTA's .fai still describes the file, and whether its sequence lines end in blanks pyfaidx counts as
bases: one small read per record (its header and first line, and the last base before it).

pyfaidx keeps an index that is newer than its FASTA without reading the FASTA: a new FASTA copied over an old
one with its own (older) modification time (`cp -p`, `rsync -a`, `tar x`) beside the old index would be read
through offsets that no longer fit: records cut short, or bases from the wrong place. The index fits when each
record's header line ends right before its first base, only line breaks lie between a record's last base and
the next header, and only line breaks follow the last record. A space or tab ending a record's first or last line
is a blank pyfaidx took for a base (the file is then read from a normalized copy). A fresh index misfits too,
since pyfaidx checks the lines of a record by their length in bytes only: a last line longer than the others, or
a line of another line end with a base more or less; that file is refused.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_GAP = 1 << 20  # bytes between two records (line breaks and a header): a larger gap is not a header
TAIL = 4096  # bytes read after the last record: line breaks only
READ_GAP = 1 << 16  # bytes between two records' checks that one read spans rather than two
READ_MOST = 1 << 23  # bytes of one such read at most
MAX_BYTES = 1 << 48  # an index's offsets and lengths: far past any genome, far below what a read can be asked
MAX_FAI_BYTES = 256 << 20  # a .fai of millions of contigs is tens of MiB
CR, LF = 13, 10
BLANKS = {b" ": "a space", b"\t": "a tab"}  # in sequence lines: pyfaidx counts each as a base, Biopython drops it
# a .fai as pyfaidx and samtools write it, which `fai_parses` accepts at C speed: each line a name without tabs or
# line breaks, then four numbers of at most 14 digits (below MAX_BYTES), each line ended by LF
FAI_TEXT = re.compile(r"(?:[^\t\r\n]+\t[0-9]{1,14}\t[0-9]{1,14}\t[0-9]{1,14}\t[0-9]{1,14}\n)*")
FAI_NAME = re.compile(r"^[^\t\n]+", re.MULTILINE)
BGZF_MIN_BLOCK = 28  # bytes of the smallest BGZF block (the empty end-of-file marker)


@dataclass(frozen=True)
class IndexScan:
    """What one pass over the records' headers and first lines found."""

    mismatch: str | None
    """The first thing the index says that the file contradicts; None when it fits."""
    blanks: str | None
    """A record whose first or last line ends in a space or tab; None when none does."""


def _header_names(line: bytes, name: str) -> bool:
    """Whether `line` is a header pyfaidx names `name`: '>' then its first whitespace-separated word."""
    s = line.rstrip(b"\r")  # (pyfaidx splits the decoded text: str.split also splits at \x1c-\x1f)
    return s[:1] == b">" and s[1:].decode("utf-8", "replace").split()[:1] == [name]


def _possible(rec: Any) -> bool:
    """Numbers a FASTA's record can have (pyfaidx takes any integers from an index it reuses; `fai_parses` bounded
    them before): none negative, bases per line at least 1 for a record with bases, bytes per line those bases and
    at most two line-break bytes."""
    return (min(rec.offset, rec.rlen, rec.lenc, rec.lenb) >= 0
            and (rec.lenc >= 1 or rec.rlen == 0) and rec.lenc <= rec.lenb <= rec.lenc + 2)


def scan_index(fasta: Any) -> IndexScan:
    """Two small reads per record of `fasta` (a FastaFile): from the last base of the record before it (at most
    MAX_GAP back) through its header line, and the last byte of its first line; neighbouring reads are made as
    one (`Reads`)."""
    records = sorted(fasta.index.items(), key=lambda kv: kv[1].offset)
    if not records:
        return IndexScan("an empty index", None)
    if bad := next((f"record {name!r} has impossible numbers" for name, rec in records if not _possible(rec)), None):
        return IndexScan(bad, None)
    spans: list[tuple[int, int]] = []  # per record: its gap and header [lo, offset), its first line's last byte
    end, ended = 0, False  # byte after the previous record's last base; whether it had bases
    for i, (name, rec) in enumerate(records):
        if rec.offset < end or (i > 0 and rec.offset - end > MAX_GAP):
            return IndexScan(f"record {name!r} starts at byte {rec.offset}, not after the record before it", None)
        line1 = rec.offset + min(rec.lenc, rec.rlen)  # byte after its first line's bases
        spans += [(max(end, rec.offset - MAX_GAP) - int(ended), rec.offset), (max(line1 - 1, rec.offset), line1)]
        end = fasta._byte_offset(name, rec.rlen - 1) + 1 if rec.rlen else rec.offset
        ended = rec.rlen > 0
    reads, blanks = Reads(fasta, spans), None
    for i, (name, rec) in enumerate(records):
        data, line1_end = reads.span(2 * i), reads.span(2 * i + 1)
        back = int(i > 0 and records[i - 1][1].rlen > 0)  # the record before's last base: the read's first byte
        if back and data[:back] in (b"\r", b"\n", b">"):
            return IndexScan(f"the last base of {records[i - 1][0]!r} is where a line ends", None)
        if blanks is None and data[:back] in BLANKS:
            blanks = records[i - 1][0]
        gap = data[back:]
        if not rec.rlen and not gap.endswith(b"\n") and not fasta.read_at(rec.offset, 1):
            gap += b"\n"  # an empty record whose header line ends the file without a line break
        lines = gap.rsplit(b"\n", 2)
        if not gap.endswith(b"\n") or len(lines) < 2 or not _header_names(lines[-2], name):
            return IndexScan(f"no header line '>{name}' right before its first base", None)
        if i > 0 and gap[: len(gap) - len(lines[-2]) - 1].strip(b"\r\n"):
            return IndexScan(f"record {name!r}: bases between its header and the record before it", None)
        if blanks is None and line1_end in BLANKS:
            blanks = name
    last = fasta.read_at(end - 1, 1) if ended else b""
    if ended and last in (b"", b"\r", b"\n", b">"):
        return IndexScan(f"the file ends before the last base of {records[-1][0]!r}", blanks)
    if blanks is None and last in BLANKS:
        blanks = records[-1][0]
    if fasta.read_at(end, TAIL).strip(b"\r\n"):
        return IndexScan(f"bases after the end of the last record, {records[-1][0]!r}", blanks)
    return IndexScan(None, blanks)


class Reads:
    """Byte spans of a file, each [lo, hi) with lo at or after the one before's, read through `fasta.read_at` as
    few reads: spans at most READ_GAP apart share one of at most READ_MOST bytes (or one span's). An assembly of
    short contigs is then a handful of large reads, not two per record; a genome's chromosomes stay apart."""

    def __init__(self, fasta: Any, spans: list[tuple[int, int]]):
        self.fasta, self.spans = fasta, spans
        self.reads: list[list[int]] = []  # [lo, hi) of each read
        self.read_of: list[int] = []  # per span: its read
        for lo, hi in spans:
            if not self.reads or lo - self.reads[-1][1] > READ_GAP or hi - self.reads[-1][0] > READ_MOST:
                self.reads.append([lo, hi])
            self.reads[-1][1] = max(self.reads[-1][1], hi)
            self.read_of.append(len(self.reads) - 1)
        self.held, self.data = -1, b""  # the read whose bytes are held

    def span(self, i: int) -> bytes:
        """The bytes of span i: fewer at the file's end, as read_at gives them."""
        k = self.read_of[i]
        if k != self.held:
            lo, hi = self.reads[k]
            self.held, self.data = k, self.fasta.read_at(lo, hi - lo)
        base, (lo, hi) = self.reads[k][0], self.spans[i]
        return self.data[lo - base: hi - base]


def first_non_base(data: bytes | bytearray, at: int, lenc: int, lenb: int) -> tuple[int, str]:
    """Where bytes of a record's sequence lines, starting `at` bytes into them, first break the layout its index
    gives (each line `lenc` bases, then `lenb - lenc` bytes of line end: carriage returns, then LF): (bases
    before it in the record, what is there). A blank anywhere; a carriage return among the bases; a base or
    anything but the line end where the line should end. Read byte by byte: only for the error's message."""
    col, base = (at % lenb, at // lenb * lenc + min(at % lenb, lenc)) if lenb else (at, at)
    for byte in bytes(data):
        if bytes([byte]) in BLANKS:
            return base, BLANKS[bytes([byte])]
        if col < lenc or not lenb:
            if byte == CR:
                return base, "a carriage return among its bases"
            base += 1
        elif byte != (LF if col == lenb - 1 else CR):
            return base, "a line that ends otherwise than its first line"
        col = (col + 1) % lenb if lenb else col + 1
    raise AssertionError("first_non_base: the bytes fit the layout")  # the caller found them not to


def fai_parses(fai: Path) -> bool:
    """Whether pyfaidx can read a .fai as it reads one (each line, right-stripped, five tab-separated fields, the
    last four integers; a repeated name is an error there): UTF-8, at most MAX_FAI_BYTES, each number within
    MAX_BYTES (pyfaidx computes with them in floating point), names unique. One it cannot read (a torn or
    garbled index) is built again: pyfaidx's ValueError would name the FASTA, which may be sound."""
    if fai.stat().st_size > MAX_FAI_BYTES:
        return False
    try:
        text = fai.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    if FAI_TEXT.fullmatch(text):
        names = FAI_NAME.findall(text)
        return len(set(names)) == len(names)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # read as pyfaidx reads: universal newlines
    names: set[str] = set()
    for line in lines[:-1] if lines[-1] == "" else lines:
        fields = line.rstrip().split("\t")
        if len(fields) != 5 or fields[0] in names:
            return False
        names.add(fields[0])
        try:
            if not all(abs(int(v)) < MAX_BYTES for v in fields[1:]):
                return False
        except ValueError:  # not an integer, or too many digits to read
            return False
    return True


def gzi_fits(gzi: Path, bgzf: Path) -> bool:
    """Whether a .gzi (htslib's BGZF index: a little-endian count, then that many (compressed, uncompressed)
    block starts, the first block's (0, 0) left out) describes the BGZF file `bgzf`: as many entries as it
    declares, no more than the file has blocks, and each start the one the block before it ends at (its header's
    size, its footer's uncompressed size: two small reads a block). pyfaidx reads a .gzi as it is (a short one is
    a struct.error, a start past the file an invalid seek, one inside a block garbles the reads through it), so
    one that does not fit is built again."""
    size, compressed = gzi.stat().st_size, bgzf.stat().st_size
    if size < 8 or (size - 8) % 16 or (size - 8) // 16 > compressed // BGZF_MIN_BLOCK:
        return False
    data = gzi.read_bytes()
    if struct.unpack_from("<Q", data)[0] != (size - 8) // 16:
        return False
    starts = [(0, 0), *struct.iter_unpack("<QQ", data[8:])]
    with bgzf.open("rb") as fh:
        fd = fh.fileno()
        for (c0, u0), (c1, u1) in zip(starts, starts[1:], strict=False):
            length = _block_length(fd, c0)
            if length is None or c0 + length != c1 or u0 + _isize(fd, c1) != u1:
                return False
        return starts[-1][0] < compressed and _block_length(fd, starts[-1][0]) is not None


def _block_length(fd: int, at: int) -> int | None:
    """Bytes of the BGZF block starting at byte `at` (its BC extra field's size + 1); None when no BGZF block
    header starts there."""
    head = os.pread(fd, 18, at) if at < MAX_BYTES else b""
    if len(head) < 18 or head[:4] != b"\x1f\x8b\x08\x04" or head[12:14] != b"BC":
        return None
    return struct.unpack_from("<H", head, 16)[0] + 1


def _isize(fd: int, end: int) -> int:
    """The uncompressed size a BGZF block ending at byte `end` records in its last 4 bytes."""
    tail = os.pread(fd, 4, end - 4)
    return struct.unpack("<I", tail)[0] if len(tail) == 4 else -1
