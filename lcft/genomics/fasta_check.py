"""Whether a FASTA's .fai still describes the file: each record's header line right before its first base, only
line breaks and the next header (or the end of the file) right after its last base.

pyfaidx keeps an index that is newer than its FASTA without reading the FASTA: a new FASTA copied over an old
one with its own (older) modification time (`cp -p`, `rsync -a`, `tar x`) beside the old index would be read
through offsets that no longer fit: records cut short, or bases from the wrong place. One small read per
record tells (the header's bytes between two records), far cheaper than indexing again.
"""

from __future__ import annotations

import re
from typing import Any

MAX_GAP = 1 << 20  # bytes between two records (line breaks and a header): a larger gap is not a header
TAIL = 4096  # bytes read after the last record: line breaks only, then the end of the file


def index_mismatch(fasta: Any) -> str | None:
    """The first thing the index of `fasta` (a FastaFile) says that the file contradicts; None when it fits."""
    records = sorted(fasta.index.items(), key=lambda kv: kv[1].offset)
    end = 0  # byte after the previous record's last base
    for i, (name, rec) in enumerate(records):
        if rec.offset < end or rec.offset - end > MAX_GAP:
            return f"record {name!r} starts at byte {rec.offset}, not after the record before it"
        gap = fasta.read_at(end, rec.offset - end)
        head = gap.rsplit(b"\n", 2)
        line = head[-2] if len(head) >= 2 else b""
        header = rb">" + re.escape(name.encode()) + rb"(\s[^\n]*)?"
        if not gap.endswith(b"\n") or not re.fullmatch(header, line.rstrip(b"\r")):
            return f"no header line '>{name}' right before its first base"
        before = gap[: len(gap) - len(line) - 1]
        if i > 0 and before.strip(b"\r\n"):
            return f"record {name!r}: bases between its header and the record before it"
        end = fasta._byte_offset(name, rec.rlen - 1) + 1 if rec.rlen else rec.offset
    last = fasta.read_at(end - 1, 1) if records[-1][1].rlen else b"A"  # the last base must still be there
    tail = fasta.read_at(end, TAIL)
    if not last or last in b"\r\n>":
        return f"the file ends before the last base of {records[-1][0]!r}"
    if len(tail) == TAIL or tail.strip(b"\r\n"):
        return f"bases after the end of the last record, {records[-1][0]!r}"
    return None
