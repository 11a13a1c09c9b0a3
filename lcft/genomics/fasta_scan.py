"""Whether a FASTA's .fai still describes the file, and whether its sequence lines end in blanks pyfaidx counts as
bases: two small reads per record (its header with the last base before it, and its first line's last byte).

pyfaidx keeps an index that is newer than its FASTA without reading the FASTA: a new FASTA copied over an old
one with its own (older) modification time (`cp -p`, `rsync -a`, `tar x`) beside the old index would be read
through offsets that no longer fit: records cut short, or bases from the wrong place. The index fits when each
record's header line ends right before its first base, only line breaks lie between a record's last base and
the next header, and only line breaks follow the last record. A space or tab ending a record's first or last line
is a blank pyfaidx took for a base (the file is then read from a normalized copy). A fresh index misfits too,
since pyfaidx checks the lines of a record by their length in bytes only: a last line longer than the others, or
a line of another line end with a base more or less; that file is refused.

`_scan_records` is the check, record by record, and says what is wrong; `_read_fits` decides the same with
numpy for the layout nearly every FASTA has, many records a read at a time, and hands the records of a read it
cannot decide to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from lcft.genomics.fasta_check import BLANKS, CR, LF

MAX_GAP = 1 << 20  # bytes between two records (line breaks and a header): a larger gap is not a header
TAIL = 4096  # bytes read after the last record: line breaks only
READ_GAP = 1 << 16  # bytes between two records' reads that one read spans rather than two
READ_MOST = 1 << 23  # bytes of one such read: a read ends where this many bytes of the file end (one span more)
PLAIN_RECORDS = 16  # records a read holds on average from which numpy is faster than a record at a time
RECHECK_FROM_START = False  # True: a read numpy cannot decide hands every record, from the first, to _scan_records
# (as it was before only the records of that read were; kept for benchmarks/fasta_open.py to compare)
NAME_SPACE = re.compile(r"\s")  # what str.split() splits at: a record's name has none
NAME_ENDS = np.frombuffer(b"\n\r \t", np.uint8)  # ASCII bytes ending a header's first word
BLANK_BYTES = np.frombuffer(b" \t", np.uint8)  # BLANKS, as bytes
LAST_BASE_NOT = np.frombuffer(b"\r\n> \t", np.uint8)  # a record's last base is none of these


@dataclass(frozen=True)
class IndexScan:
    """What one pass over the records' headers and first lines found."""

    mismatch: str | None
    """The first thing the index says that the file contradicts; None when it fits."""
    blanks: str | None
    """A record whose first or last line ends in a space or tab; None when none does."""


@dataclass(frozen=True)
class Records:
    """An index's records in file order, as columns: name, first base's byte, bases, bases and bytes a line, and
    the byte after the last base."""

    names: list[str]
    offset: np.ndarray  # (n,) int64
    rlen: np.ndarray
    lenc: np.ndarray
    lenb: np.ndarray

    @staticmethod
    def of(index: Any) -> Records:
        """The records of a pyfaidx index (numbers `fai_parses` bounded far below 2**63), sorted by offset."""
        recs = list(index.values())
        fields = ("offset", "rlen", "lenc", "lenb")
        cols = [np.fromiter(map(attrgetter(f), recs), np.int64, len(recs)) for f in fields]
        order = np.argsort(cols[0], kind="stable")
        names = list(index)
        return Records([names[k] for k in order.tolist()], *(c[order] for c in cols))

    def end(self) -> np.ndarray:
        """(n,) the byte after each record's last base; its offset when it has none."""
        last, per_line = self.rlen - 1, np.maximum(self.lenc, 1)
        return np.where(self.rlen > 0, self.offset + last // per_line * self.lenb + last % per_line + 1, self.offset)

    def impossible(self) -> np.ndarray:
        """(n,) numbers no FASTA's record can have (pyfaidx takes any integers from an index it reuses): one
        negative, no bases a line for a record with bases, bytes a line other than its bases and at most two
        line-break bytes."""
        ok = ((np.minimum(np.minimum(self.offset, self.rlen), np.minimum(self.lenc, self.lenb)) >= 0)
              & ((self.lenc >= 1) | (self.rlen == 0)) & (self.lenc <= self.lenb) & (self.lenb <= self.lenc + 2))
        return ~ok


def scan_index(fasta: Any) -> IndexScan:
    """Two small reads per record of `fasta` (a FastaFile): from the last base of the record before it (at most
    MAX_GAP back) through its header line, and the last byte of its first line; neighbouring reads are made as
    one (`Reads`)."""
    if not fasta.index:
        return IndexScan("an empty index", None)
    recs = Records.of(fasta.index)
    if (bad := recs.impossible()).any():
        return IndexScan(f"record {recs.names[int(bad.argmax())]!r} has impossible numbers", None)
    end = recs.end()
    prev_end = np.concatenate(([0], end[:-1]))  # (n,)
    ended = np.concatenate(([0], recs.rlen[:-1] > 0)).astype(np.int64)  # (n,) the record before has bases
    apart = (recs.offset < prev_end) | ((recs.offset - prev_end > MAX_GAP) & (np.arange(len(end)) > 0))
    if apart.any():
        k = int(apart.argmax())
        return IndexScan(f"record {recs.names[k]!r} starts at byte {recs.offset[k]}, not after the record before "
                         "it", None)
    line1 = recs.offset + np.minimum(recs.lenc, recs.rlen)  # (n,) the byte after its first line's bases
    lo = np.stack([np.maximum(prev_end, recs.offset - MAX_GAP) - ended, np.maximum(line1 - 1, recs.offset)], 1)
    reads = Reads(fasta, lo.ravel(), np.stack([recs.offset, line1], 1).ravel())  # (2n,): header, first line's end
    heads = _plain_heads(recs) if len(reads.read_lo) * PLAIN_RECORDS <= len(end) else None
    if heads is None:
        found = _scan_records(fasta, recs, reads, range(len(end)))
    else:
        found = _scan_reads(fasta, recs, reads, heads)
    if found.mismatch:
        return found
    blanks, end, ended = found.blanks, int(end[-1]), bool(recs.rlen[-1] > 0)
    last = fasta.read_at(end - 1, 1) if ended else b""
    if ended and last in (b"", b"\r", b"\n", b">"):
        return IndexScan(f"the file ends before the last base of {recs.names[-1]!r}", blanks)
    if blanks is None and last in BLANKS:
        blanks = recs.names[-1]
    if fasta.read_at(end, TAIL).strip(b"\r\n"):
        return IndexScan(f"bases after the end of the last record, {recs.names[-1]!r}", blanks)
    return IndexScan(None, blanks)


def long_header(index: Any) -> str | None:
    """The first record of a fresh index with over MAX_GAP bytes between the record before it and its first base
    (its header line, for a file pyfaidx indexed): the checks do not read that far, so it fails them as though
    misplaced; None when there is none."""
    if not index:
        return None
    recs = Records.of(index)
    far = recs.offset - np.concatenate(([0], recs.end()[:-1])) > MAX_GAP  # (n,)
    return recs.names[int(far.argmax())] if far.any() else None


class Reads:
    """Byte spans of a file, each [lo, hi) with lo at or after the one before's, read through `fasta.read_at` as
    few reads: spans at most READ_GAP apart share a read, which ends where a READ_MOST block of the file ends. An
    assembly of short contigs is then a handful of large reads, not two per record; a genome's chromosomes stay
    apart."""

    def __init__(self, fasta: Any, lo: np.ndarray, hi: np.ndarray) -> None:
        self.fasta, self.lo, self.hi = fasta, lo, hi  # (m,) each
        top = np.maximum.accumulate(hi)  # (m,) the furthest byte any span so far reaches
        new = np.ones(len(lo), bool)  # (m,) a span that starts a read
        new[1:] = (lo[1:] - top[:-1] > READ_GAP) | (lo[1:] // READ_MOST != lo[:-1] // READ_MOST)
        self.read_of = np.cumsum(new) - 1  # (m,) each span's read
        starts = np.flatnonzero(new)
        self.read_lo, self.read_hi = lo[starts], np.maximum.reduceat(hi, starts)  # (reads,) each
        self.held: dict[int, bytes] = {}  # the last two reads made: a record's header and first line may span two

    def read(self, k: int) -> bytes:
        """The bytes of read k: fewer at the file's end, as read_at gives them."""
        if k not in self.held:
            lo, hi = int(self.read_lo[k]), int(self.read_hi[k])
            self.held = {j: data for j, data in self.held.items() if j == k - 1}
            self.held[k] = self.fasta.read_at(lo, hi - lo)
        return self.held[k]

    def span(self, i: int) -> bytes:
        """The bytes of span i: fewer at the file's end."""
        k = int(self.read_of[i])
        base = int(self.read_lo[k])
        return self.read(k)[int(self.lo[i]) - base: int(self.hi[i]) - base]


def _header_names(line: bytes, name: str) -> bool:
    """Whether `line` is a header pyfaidx names `name`: '>' then its first whitespace-separated word."""
    s = line.rstrip(b"\r")  # (pyfaidx splits the decoded text: str.split also splits at \x1c-\x1f)
    return s[:1] == b">" and s[1:].decode("utf-8", "replace").split()[:1] == [name]


def _scan_records(fasta: Any, recs: Records, reads: Reads, which: Iterable[int]) -> IndexScan:
    """The checks of records `which` (in file order) one by one: the first mismatch, or the first record whose
    first line or the record before's last line ends in a blank."""
    blanks = None
    for i in which:
        name = recs.names[i]
        data, line1_end = reads.span(2 * i), reads.span(2 * i + 1)
        back = int(i > 0 and recs.rlen[i - 1] > 0)  # the record before's last base: the read's first byte
        if back and data[:back] in (b"\r", b"\n", b">"):
            return IndexScan(f"the last base of {recs.names[i - 1]!r} is where a line ends", None)
        if blanks is None and data[:back] in BLANKS:
            blanks = recs.names[i - 1]
        gap = data[back:]
        if not recs.rlen[i] and not gap.endswith(b"\n") and not fasta.read_at(int(recs.offset[i]), 1):
            gap += b"\n"  # an empty record whose header line ends the file without a line break
        lines = gap.rsplit(b"\n", 2)
        if not gap.endswith(b"\n") or len(lines) < 2 or not _header_names(lines[-2], name):
            return IndexScan(f"no header line '>{name}' right before its first base", None)
        if i > 0 and gap[: len(gap) - len(lines[-2]) - 1].strip(b"\r\n"):
            return IndexScan(f"record {name!r}: bases between its header and the record before it", None)
        if blanks is None and line1_end in BLANKS:
            blanks = name
    return IndexScan(None, blanks)


@dataclass(frozen=True)
class Heads:
    """The header each record of the plain layout has: '>' and its name, as bytes."""

    width: np.ndarray  # (n,) bytes of '>' and the name
    want: np.ndarray  # (sum(width),) uint8: every record's, one after another
    name_at: np.ndarray  # (n,) where each record's starts in `want`


def _plain_heads(recs: Records) -> Heads | None:
    """The records' headers when they may be of the layout nearly every FASTA has, which `_read_fits` judges:
    every record with bases, its name its header's first word. None hands every record to `_scan_records`."""
    if "" in recs.names or NAME_SPACE.search("".join(recs.names)) or (recs.rlen == 0).any():
        return None
    try:
        heads = [b">" + name.encode() for name in recs.names]  # (a name from a .fai may not encode)
    except UnicodeEncodeError:
        return None
    width = np.fromiter(map(len, heads), np.int64, len(heads))
    return Heads(width, np.frombuffer(b"".join(heads), np.uint8), np.cumsum(width) - width)


def _scan_reads(fasta: Any, recs: Records, reads: Reads, heads: Heads) -> IndexScan:
    """`_scan_records` of every record, decided with numpy a read at a time (`_read_fits`); only the records of a
    read it cannot decide are checked one by one, and the result is theirs: numpy accepts only what that accepts."""
    head_read, line1_read = reads.read_of[0::2], reads.read_of[1::2]  # (n,) each, nondecreasing
    fits = np.zeros(len(reads.read_lo), bool)  # (reads,)
    blanks = None
    for k in range(len(reads.read_lo)):
        fits[k] = _read_fits(k, recs, reads, heads)
        if not fits[k] and RECHECK_FROM_START:
            return _scan_records(fasta, recs, reads, range(len(recs.names)))
        a, b = np.searchsorted(line1_read, [k, k + 1])  # the records whose first line ends in this read
        undecided = np.flatnonzero(~(fits[k] & fits[head_read[a:b]])) + a  # (their headers may lie in the last)
        if len(undecided):
            found = _scan_records(fasta, recs, reads, undecided.tolist())
            if found.mismatch:
                return found
            blanks = blanks or found.blanks
    return IndexScan(None, blanks)


def _read_fits(k: int, recs: Records, reads: Reads, heads: Heads) -> bool:
    """Whether `_scan_records` would find neither a mismatch nor a blank in read k (the headers and first lines'
    ends it holds), decided with numpy for the plain layout: one line break (LF or CRLF) between a record's last
    base and the next header. False leaves it to `_scan_records`, which says what is wrong: this only ever accepts
    what that accepts."""
    buf, base = np.frombuffer(reads.read(k), np.uint8), int(reads.read_lo[k])
    a, b = np.searchsorted(reads.read_of[0::2], [k, k + 1])
    width = heads.width
    if a < b and not _headers_fit(buf, reads.lo[0::2][a:b] - base, recs.offset[a:b] - base, a, width[a:b],
                                  heads.want[heads.name_at[a]: heads.name_at[b - 1] + width[b - 1]]):
        return False
    a, b = np.searchsorted(reads.read_of[1::2], [k, k + 1])
    at = reads.lo[1::2][a:b] - base  # (records,) each first line's last base
    return not (a < b and (at[-1] >= len(buf) or np.isin(buf[at], BLANK_BYTES).any()))  # ends early, or a blank


def _headers_fit(buf: np.ndarray, lo: np.ndarray, offset: np.ndarray, first: int, width: np.ndarray,
                 want: np.ndarray) -> bool:
    """Whether records first, first + 1, ... have, in `buf`, from `lo` (the record before's last base, or the
    file's start) to `offset` (their first base): that base, one line break, '>' and their name (`want`, `width`
    bytes each), then a blank or a line break, and the rest of the header line."""
    eol = offset - 1  # (r,) the line break ending each header
    if eol[-1] >= len(buf) or (buf[eol] != LF).any():
        return False
    breaks = np.flatnonzero(buf == LF)
    k = np.searchsorted(breaks, eol) - 1  # (r,) the line break before each header's, when buf has one
    before = np.where(k >= 0, breaks[np.maximum(k, 0)], -1)  # (r,)
    after = lo + (np.arange(len(lo)) + first > 0)  # (r,) the byte after the record before's last base
    if np.isin(buf[lo[after > lo]], LAST_BASE_NOT).any():
        return False
    if first == 0 and lo[0] == 0 and before[0] < 0:  # the file's first record, its header from byte 0
        after[0] = -1
    eol_bytes = np.isin(buf[np.maximum(after, 0)], np.array([CR, LF], np.uint8))
    if (before < after).any() or (before - after > 1).any() or not eol_bytes[after >= 0].all():
        return False  # a byte other than a line break, or over two, between the record before and this header
    head = before + 1  # (r,) each header's '>'
    if (head + width > eol).any():
        return False
    at = np.repeat(head - (np.cumsum(width) - width), width) + np.arange(len(want))  # (len(want),) in buf
    return bool((buf[at] == want).all() and np.isin(buf[head + width], NAME_ENDS).all())
