"""Whether a FASTA's .fai still describes the file, and whether its sequence lines end in blanks pyfaidx counts as
bases: one small read per record (its header and first line).

pyfaidx keeps an index that is newer than its FASTA without reading the FASTA: a new FASTA copied over an old
one with its own (older) modification time (`cp -p`, `rsync -a`, `tar x`) beside the old index would be read
through offsets that no longer fit: records cut short, or bases from the wrong place. The index fits when each
record's header line ends right before its first base, only line breaks lie between a record's last base and
the next header, and only line breaks follow the last record. A space or tab ending a record's first line is a
blank pyfaidx took for a base (the file is then read from a normalized copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_GAP = 1 << 20  # bytes between two records (line breaks and a header): a larger gap is not a header
TAIL = 4096  # bytes read after the last record: line breaks only
MAX_BYTES = 1 << 48  # an index's offsets and lengths: far past any genome, far below what a read can be asked


@dataclass(frozen=True)
class IndexScan:
    """What one pass over the records' headers and first lines found."""

    mismatch: str | None
    """The first thing the index says that the file contradicts; None when it fits."""
    blanks: str | None
    """A record whose first line ends in a space or tab; None when none does."""


def _header_names(line: bytes, name: str) -> bool:
    """Whether `line` is a header pyfaidx names `name`: '>' then its first whitespace-separated word."""
    s = line.rstrip(b"\r")
    return s[:1] == b">" and s[1:].split()[:1] == [name.encode()]


def _possible(rec: Any) -> bool:
    """Numbers a FASTA's record can have (pyfaidx takes any integers from an index it reuses): offset and length
    within MAX_BYTES, bases per line at least 1 for a record with bases, bytes per line those bases and at most
    two line-break bytes."""
    return (all(0 <= v < MAX_BYTES for v in (rec.offset, rec.rlen, rec.lenc, rec.lenb))
            and (rec.lenc >= 1 or rec.rlen == 0) and rec.lenc <= rec.lenb <= rec.lenc + 2)


def scan_index(fasta: Any) -> IndexScan:
    """One read per record of `fasta` (a FastaFile): from the end of the record before it (at most MAX_GAP back)
    through the end of its first line."""
    records = sorted(fasta.index.items(), key=lambda kv: kv[1].offset)
    if not records:
        return IndexScan("an empty index", None)
    if bad := next((f"record {name!r} has impossible numbers" for name, rec in records if not _possible(rec)), None):
        return IndexScan(bad, None)
    end, blanks = 0, None  # byte after the previous record's last base
    for i, (name, rec) in enumerate(records):
        if rec.offset < end or (i > 0 and rec.offset - end > MAX_GAP):
            return IndexScan(f"record {name!r} starts at byte {rec.offset}, not after the record before it", None)
        start = max(end, rec.offset - MAX_GAP)
        first = min(rec.lenc, rec.rlen)  # bases on its first line
        data = fasta.read_at(start, rec.offset - start + first)
        gap, line1 = data[: rec.offset - start], data[rec.offset - start:]
        lines = gap.rsplit(b"\n", 2)
        if not gap.endswith(b"\n") or len(lines) < 2 or not _header_names(lines[-2], name):
            return IndexScan(f"no header line '>{name}' right before its first base", None)
        if i > 0 and gap[: len(gap) - len(lines[-2]) - 1].strip(b"\r\n"):
            return IndexScan(f"record {name!r}: bases between its header and the record before it", None)
        if blanks is None and line1[-1:] in (b" ", b"\t"):
            blanks = name
        end = fasta._byte_offset(name, rec.rlen - 1) + 1 if rec.rlen else rec.offset
    if records[-1][1].rlen and fasta.read_at(end - 1, 1) in (b"", b"\r", b"\n", b">"):
        return IndexScan(f"the file ends before the last base of {records[-1][0]!r}", blanks)
    if fasta.read_at(end, TAIL).strip(b"\r\n"):
        return IndexScan(f"bases after the end of the last record, {records[-1][0]!r}", blanks)
    return IndexScan(None, blanks)
