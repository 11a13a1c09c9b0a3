"""pyfaidx's own .fai builder (`Faidx.build_index`) for the files lcft's numpy builder does not take, line for line
and error for error, with a bounded piece of a line in memory at a time (pyfaidx reads and decodes each line whole).

Each line comes as the few facts build_index asks of it (bytes, characters without its line end, first character,
whether it is all whitespace, a header's text); build_index's own steps then run on them, on a run of ASCII lines
of the same lengths (a wrapped record's body) at once: a Run, found with numpy in the piece. The one difference: a
header line whose first word has not ended within MAX_HEADER characters (a name no index could hold; told at the
end of a piece, so up to a piece more) is refused."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from itertools import chain

import numpy as np
from pyfaidx import FastaIndexingError, check_bad_lines

from lcft.genomics.fasta_scan import MAX_GAP

MAX_HEADER = MAX_GAP  # characters of a header line kept: its first word (the record's name) must end within them
Row = tuple[str, int, int, int, int]  # (name, bases, offset of its first base, bases/line, bytes/line)


class LongHeader(Exception):
    """A header line whose first word runs past MAX_HEADER characters: its message is one line for the user."""


# One line as build_index reads it: (its bytes, its characters but the \n and \r ending it, its text), the text
# what its first character, whether it is all whitespace and a header's name are read from: the line's bytes
# without LF when ASCII, else its characters without \n and \r (a stand-in of the same facts for a line read in
# pieces), None for a header whose first word has not ended within MAX_HEADER characters.
Line = tuple[int, int, "str | bytes | None"]
HEADS, COMMENTS = (">", b">"), (";", b";")
SPACE = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # the ASCII characters str.strip() strips
RUN_MIN = 8  # the fewest equal lines taken as one Run (numpy finds them; fewer are left line by line)
SAMPLE = 1 << 13  # bytes of a piece that tell whether to look for Runs in it (a few microseconds)
OUTSIDE = np.zeros(256, bool)  # first bytes of lines never in a Run: a header's, a comment's, a blank line's
OUTSIDE[list(b">;" + SPACE)] = True


class Run(bytes):
    """The text of the first of `count` (>= RUN_MIN) ASCII lines of the same bytes and characters, none a header,
    comment or blank, standing for them all: build_index's steps for its first line hold for the others (they
    are sequence lines of its lengths, or before the first record its first line is refused), so index_rows
    takes them at once."""

    count: int


def _whole(data: bytes) -> Line:
    """A line read whole (at most a piece): decoded as build_index decodes it, with its errors."""
    kept = data.decode().rstrip("\n\r")
    return len(data), len(kept), kept


def _ended(data: bytes) -> Iterable[Line]:
    """The lines of `data`, which ends with LF: ASCII ones without decoding (the same facts, runs of equal lines as
    Runs), others decoded one by one as they are read (a later line's decoding error comes after an earlier
    line's own)."""
    if not data.isascii():
        return (_whole(raw + b"\n") for raw in data[:-1].split(b"\n"))
    # records averaging under 2 * RUN_MIN lines in its first SAMPLE bytes: no Runs worth numpy's pass
    if data.count(b"\n", 0, SAMPLE) < 2 * RUN_MIN * (data.count(b"\n>", 0, SAMPLE) + 1):
        return _split(data)
    return _runs(data)


def _split(data: bytes) -> list[Line]:
    """The lines of `data` (ASCII, empty or ending with LF) one by one."""
    if not data:
        return []
    if b"\r" not in data:
        return [(len(raw) + 1, len(raw), raw) for raw in data[:-1].split(b"\n")]
    return [(len(raw) + 1, len(raw.rstrip(b"\r")), raw) for raw in data[:-1].split(b"\n")]


def _runs(data: bytes) -> list[Line]:
    """The lines of `data` (ASCII, ending with LF) as _split gives them, but each run of RUN_MIN or more lines of
    the same bytes and characters, none a header, comment or blank, as one Run (found with numpy on the piece)."""
    arr = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(arr == 10) + 1  # each line's end, past its LF
    starts = np.concatenate(([0], ends[:-1]))
    key = ends - starts  # bytes; and with CRs, whether a CR ends the text (a line with two is left out)
    inside = ~OUTSIDE[arr[starts]]
    if b"\r" in data:
        cr = arr[np.maximum(ends - 2, 0)] == 13
        inside &= ~(cr & (arr[np.maximum(ends - 3, 0)] == 13))
        key = key * 2 + cr
    edge = np.zeros(len(ends) + 1, np.int8)  # +1 where a run of lines continuing the one before begins, -1 ends
    edge[1:-1] = inside[1:] & inside[:-1] & (key[1:] == key[:-1])
    edge = np.diff(edge)
    first, last = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)  # a run's first line, and its last
    counts = last - first + 1
    first, counts = first[counts >= RUN_MIN], counts[counts >= RUN_MIN]
    out: list[Line] = []
    at = 0  # where the lines not yet given begin
    for start, end, count in zip(starts[first].tolist(), ends[first].tolist(), counts.tolist(), strict=True):
        out += _split(data[at:start])
        run = Run(data[start:end - 1])
        run.count = count
        out.append((end - start, len(run.rstrip(b"\r")), run))
        at = start + count * (end - start)
    return out + _split(data[at:])


def _blank(text: str | bytes) -> bool:
    return not (text.strip() if isinstance(text, str) else text.strip(SPACE))


class _Open:
    """A line longer than a piece, decoded a piece at a time: its facts kept as it goes."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.blen = self.chars = self.ending = 0  # ending: characters of \n and \r ending the text so far
        self.first, self.blank, self.head = "", True, ""
        self.named = self.long = False  # a long header's first word is kept / has not ended in MAX_HEADER

    def add(self, data: bytes, final: bool) -> None:
        held = len(self.decoder.getstate()[0])  # bytes of a character begun in the piece before
        try:
            text = self.decoder.decode(data, final)
        except UnicodeDecodeError as e:  # as the whole line's decode says it: positions from the line's start
            at, span = self.blen - held + e.start, e.end - e.start
            where = f"byte 0x{e.object[e.start]:02x} in position {at}" if span == 1 else \
                f"bytes in position {at}-{at + span - 1}"
            raise ValueError(f"'utf-8' codec can't decode {where}: {e.reason}") from None
        self.blen += len(data)
        if not text:
            return
        self.first = self.first or text[0]
        self.blank = self.blank and not text.strip()
        kept = text.rstrip("\n\r")
        self.ending = self.ending + len(text) if not kept else len(text) - len(kept)
        self.chars += len(text)
        if self.first == ">" and not (self.named or self.long):
            self._header(text)

    def _header(self, text: str) -> None:
        """Keep a header's text up to MAX_HEADER characters; past them, only '>' and its first word, or that
        there is none within them (`long`)."""
        self.head += text
        if len(self.head) > MAX_HEADER:
            words = self.head[1:].split()
            self.named = len(words) > 1 or bool(words and self.head[-1].isspace())  # its first word has ended
            self.long = not self.named
            self.head = ">" + words[0] if self.named else ""

    def line(self) -> Line:
        if self.long:
            return self.blen, self.chars - self.ending, None
        text = self.head.rstrip("\n\r") if self.first == ">" else "" if self.blank else self.first + "x"
        return self.blen, self.chars - self.ending, text


def lines(pieces: Iterable[bytes]) -> Iterator[Iterable[Line]]:
    """The lines of a file read as `pieces`, as build_index iterates them (split after each LF; the last one
    maybe unended), in batches (chained in C: a generator resumed a line costs more than pyfaidx's loop); a line
    within one piece is decoded whole, a longer one a piece at a time."""
    open_: _Open | None = None
    for data in pieces:
        at = 0
        if open_ is not None:  # the line begun in a piece before
            lf = data.find(b"\n")
            at = len(data) if lf < 0 else lf + 1
            open_.add(data[:at], final=lf >= 0)
            if lf < 0:
                continue
            yield (open_.line(),)
            open_ = None
        ended = data.rfind(b"\n") + 1
        if ended > at:
            yield _ended(data[at:ended])
        if max(at, ended) < len(data):
            open_ = _Open()
            open_.add(data[max(at, ended):], final=False)
    if open_ is not None:
        open_.add(b"", final=True)
        yield (open_.line(),)


def index_rows(filename: str, pieces: Iterable[bytes]) -> list[Row]:
    """build_index's rows for the file read as `pieces`, or its error: FastaIndexingError, RuntimeError (its
    check_bad_lines), ValueError (a line that is not UTF-8). `filename` is named in its messages."""
    rows: list[Row] = []
    rname: str | None = None
    offset = rlen = blen = clen = thisoffset = 0
    bad_lines: list[tuple[int, int]] = []  # at most 3 kept: check_bad_lines reads no more (> 2 is inconsistent)
    valid_entry, i, skipped = False, -1, 0  # skipped: a Run's lines but its first, so line i + skipped is read
    for i, (line_blen, line_clen, text) in enumerate(chain.from_iterable(lines(pieces))):
        header = text is None or text[:1] in HEADS
        if rname is None and not header:
            if text[:1] in COMMENTS or _blank(text):  # comment and blank lines before the first record
                offset += line_blen
                continue
            raise FastaIndexingError(
                f"Unexpected text before the first sequence definition line in {filename} at line "
                f"{i + skipped + 1}. Check that sequence definition lines start with '>' and comment lines with ';'.")
        if header:
            valid_entry = check_bad_lines(rname, bad_lines, i + skipped - 1)
            if valid_entry and rname is not None:
                rows.append((rname, rlen, thisoffset, clen, blen))
            elif not valid_entry:
                raise _inconsistent(rname, bad_lines)
            blen = rlen = clen = 0
            bad_lines = []
            if text is None:
                raise LongHeader(f"line {i + skipped + 1} is a header over {MAX_HEADER >> 20} MiB long without a "
                                 f"name ended in its first {MAX_HEADER >> 20} MiB; shorten it")
            head = text if isinstance(text, str) else text.rstrip(b"\r").decode()
            words = head[1:].split()
            if not words:
                raise FastaIndexingError(f"Bad sequence name {head} at line {i + skipped}.")
            rname = words[0]
            offset += line_blen
            thisoffset = offset
        else:
            if not blen:
                blen, clen = line_blen, clen or line_clen
            elif not clen:
                clen = line_clen
            if (line_blen != blen or line_blen == 1) and len(bad_lines) < 3:
                bad_lines.append((i + skipped, line_blen))
            offset += line_blen
            rlen += line_clen
            if type(text) is Run:  # its other lines: this one's steps again (clen is set: its lines have bases)
                more = text.count - 1
                if line_blen != blen:
                    line = i + skipped
                    bad_lines += [(line + k, line_blen) for k in range(1, 1 + min(more, 3 - len(bad_lines)))]
                offset, rlen, skipped = offset + more * line_blen, rlen + more * line_clen, skipped + more
    if not valid_entry:
        raise FastaIndexingError(f"The FASTA file {filename} does not contain a valid sequence. Check that "
                                 "sequence definition lines start with '>'.")
    if i >= 0:  # the last line read
        if not check_bad_lines(rname, bad_lines, i + skipped):
            raise _inconsistent(rname, bad_lines)
        rows.append((rname, rlen, thisoffset, clen, blen))  # type: ignore[arg-type]
    return rows


def _inconsistent(rname: str | None, bad_lines: list[tuple[int, int]]) -> FastaIndexingError:
    return FastaIndexingError("Line length of fasta file is not consistent! Inconsistent line found in "
                              f">{rname} at line {bad_lines[0][0] + 1:n}.")
