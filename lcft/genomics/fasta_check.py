"""Whether the index files found beside a FASTA can be read as pyfaidx reads them (a .fai, a BGZF's .gzi); what
a refused FASTA's bytes say about why (where a record first breaks the layout its index gives, a letter of several
bytes among bases, a header joined to a sequence line, pyfaidx's own indexing errors in one line), and what a
mistaken path or record name was likely meant to be. Whether the records fit the file is fasta_scan's.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import struct
from pathlib import Path
from typing import IO

from lcft.errors import LcftError, closest, did_you_mean, reason
from lcft.files import read_bytes, read_text

MAX_BYTES = 1 << 48  # an index's offsets and lengths: far past any genome, far below what a read can be asked
MAX_FAI_BYTES = 256 << 20  # a .fai of millions of contigs is tens of MiB
CR, LF, GT = 13, 10, 62
GZIP_MAGIC = b"\x1f\x8b"
NORMALIZED = ".lf.fa"  # the name a normalized copy ends with (lcft.genomics.fasta_cache makes it)
JOINED_HEADER = "a '>' inside a sequence line"  # never a base: a header joined to the line before it (`joined_cause`)
BLANKS = {b" ": "a space", b"\t": "a tab"}  # in sequence lines: pyfaidx counts each as a base, Biopython drops it
NAME_ENDS = {bytes([c]) for c in b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"}  # what ends a header's first word (str.split)
# a .fai as pyfaidx and samtools write it, which `fai_parses` accepts at C speed: each line a name without tabs or
# line breaks, then four numbers of at most 14 digits (below MAX_BYTES), each line ended by LF
FAI_TEXT = re.compile(r"(?:[^\t\r\n]+\t[0-9]{1,14}\t[0-9]{1,14}\t[0-9]{1,14}\t[0-9]{1,14}\n)*")
FAI_NAME = re.compile(r"^[^\t\n]+", re.MULTILINE)
BGZF_MIN_BLOCK = 28  # bytes of the smallest BGZF block (the empty end-of-file marker)
# the mitochondrion's names, lower case: UCSC's chrM (hg38, mm10), Ensembl's and NCBI's MT; neither is the other with
# or without 'chr', the rule that pairs every other UCSC and Ensembl chromosome name
MITOCHONDRION = ("chrm", "mt", "chrmt", "m")
UCSC_CONTIG = re.compile(r"chr[^_]+_([a-z]{2}\d+)v(\d+)(?:_[a-z]+)?")  # chrUn_KI270302v1, chr1_KI270706v1_random


def first_non_base(data: bytes | bytearray, at: int, lenc: int, lenb: int) -> tuple[int, str]:
    """Where bytes of a record's sequence lines, starting `at` bytes into them, first break the layout its index
    gives (each line `lenc` bases, then `lenb - lenc` bytes of line end: carriage returns, then LF): (bases
    before it in the record, what is there). A blank anywhere; a '>' (JOINED_HEADER); a carriage return among the
    bases; a base or anything but the line end where the line should end. Read byte by byte: only for the error's
    message."""
    col, base = (at % lenb, at // lenb * lenc + min(at % lenb, lenc)) if lenb else (at, at)
    for byte in bytes(data):
        if bytes([byte]) in BLANKS:
            return base, BLANKS[bytes([byte])]
        if byte == GT:
            return base, JOINED_HEADER
        if col < lenc or not lenb:
            if byte == CR:
                return base, "a carriage return among its bases"
            base += 1
        elif byte != (LF if col == lenb - 1 else CR):
            return base, "a line that ends otherwise than its first line"
        col = (col + 1) % lenb if lenb else col + 1
    raise AssertionError("first_non_base: the bytes fit the layout")  # the caller found them not to


def joined_header(path: Path, where: str) -> LcftError:
    """The refusal of a '>' among bases, at `where` ('line 7', or a record and base): a header joined to the
    sequence line before it, which no re-wrap mends; pyfaidx would read its name as bases of the record before."""
    return LcftError(f"{path}: {joined_cause(where)}")


def joined_cause(where: str, what: str = "a '>'") -> str:
    """Why `where` (a line, or a record and base) holding `what` ('>' or a header) among bases is refused, and
    the mend: the text of `joined_header`, also said where a record asked for by name is missing for it."""
    return (f"{where} holds {what} inside a sequence line: a header joined to the sequence before it, as when a file "
            "without a final line end is joined with another (`cat a.fa b.fa`); break the line before its '>', e.g. "
            "`sed '/^>/!s/>/\\n>/' in.fa > out.fa`")


def indexing_error(path: Path, e: Exception) -> LcftError:
    """pyfaidx's error building an index, as one line naming the record and what to do."""
    msg = str(e).strip()
    if "Inconsistent line found in >" in msg:
        tail = msg.split("Inconsistent line found in >", 1)[1].rstrip(".")
        rec, _, line = tail.partition(" at line ")
        return LcftError(
            f"{path}: record {rec!r} has inconsistent line lengths at line {line} (every line of a record "
            "but the last must hold the same number of bases; re-wrap it, e.g. `seqkit seq -w 60`)"
        )
    if "Unhandled exception during fasta indexing at entry " in msg:  # pyfaidx's other line-length check
        rec = msg.split("at entry ", 1)[1].split("Please report", 1)[0]
        found = msg.rsplit("[", 1)[-1].rstrip("]") if msg.endswith("]") else ""
        return LcftError(
            f"{path}: record {rec!r} has inconsistent line lengths (pyfaidx reports {found}); every "
            "line of a record but the last must hold the same number of bases: re-wrap it, e.g. `seqkit seq -w 60`"
        )
    if "does not contain a valid sequence" in msg:
        return LcftError(f"empty FASTA: {path} has no sequence records")
    return LcftError(f"{path}: pyfaidx cannot index this FASTA: {reason(e)}")


def odd_sequence_line(path: Path, block: int = 1 << 24) -> tuple[int, bytes] | None:
    """The first line (1-based) of a FASTA that is not a header and holds a byte above 127 or a '>', with that byte,
    or None. A byte above 127 is part of a letter pyfaidx counts as one character where its bytes are two or more,
    so its index does not fit the file; a '>' after a line's start is a header joined to the sequence line before
    it (`cat a.fa b.fa`, a.fa without a final line end), so that line's length is not its record's: the file is
    refused for either, and this names the cause. Reads the whole file (plain, or a BGZF/gzip one decompressed):
    only for an error's message."""
    lines, first = 0, b""  # newlines before the block; the first byte of the line it starts in (b"": its own)
    with decompressed(path) as fh:
        while data := fh.read(block):
            for m in re.finditer(rb"[\x80-\xff>]", data):
                start = data.rfind(b"\n", 0, m.start()) + 1
                head = data[start:start + 1] if start else (first or data[:1])
                if head != b">":
                    return lines + data.count(b"\n", 0, m.start()) + 1, m.group()
            last = data.rfind(b"\n")
            if last >= 0:
                first = data[last + 1:last + 2]  # b"" when the line starts the next block
            elif not first:
                first = data[:1]
            lines += data.count(b"\n")
    return None


def non_utf8_line(path: Path, block: int = 1 << 24) -> int | None:
    """The first line (1-based) of a FASTA (plain, or a BGZF/gzip one decompressed) whose bytes are not UTF-8 text,
    or None: pyfaidx decodes each line, and says only where in its line the byte is. Reads the file up to that
    line: only for an error's message."""
    decoder, lines = codecs.getincrementaldecoder("utf-8")(), 0
    with decompressed(path) as fh:
        while data := fh.read(block):
            held = len(decoder.getstate()[0])  # bytes of a character begun in the block before (no line break)
            try:
                decoder.decode(data)
            except UnicodeDecodeError as e:
                return lines + data.count(b"\n", 0, max(e.start - held, 0)) + 1
            lines += data.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:  # the file ends inside a character
        return lines + 1
    return None


def decompressed(path: Path) -> IO[bytes]:
    """The FASTA's bytes as its index counts them: a gzip (BGZF or plain) read through gzip, else the file."""
    return gzip.open(path, "rb") if packed(path) else open(path, "rb")


def packed(path: Path) -> bool:
    """Whether `path` is a gzip (BGZF or plain)."""
    return gzip_kind(path) != "plain"


def gzip_kind(path: Path) -> str:
    """'plain' (not compressed), 'bgzf' (block gzip: random access), or 'gzip' (plain gzip: no random access)."""
    with open(path, "rb") as fh:
        head = fh.read(18)
    if not head.startswith(GZIP_MAGIC):
        return "plain"
    # BGZF = gzip member with FEXTRA (flag bit 2) holding a 'BC' subfield (SAM spec, section 4.1).
    if len(head) >= 18 and head[3] & 4 and head[12:14] == b"BC":
        return "bgzf"
    return "gzip"


def glued_headers(path: Path, names: list[str], block: int = 1 << 24) -> dict[str, int]:
    """Of record names the index lacks, those whose header ('>' + the name, then a blank, a line end or the file's
    end: the name as its first word) stands inside a sequence line, each with that line (1-based, the first such),
    as a header joined to the line before it does (`cat a.fa b.fa`, a.fa without a final line end). Reads the
    file (plain, or a BGZF/gzip one decompressed) in blocks: one pass for '>' (memchr), one counting its LFs, as
    `odd_sequence_line` counts lines (a CR ends a line too where it says whether a '>' starts one); only for an
    error's message."""
    wanted = {b">" + n.encode(): n for n in names}
    longest = max(map(len, wanted), default=0)
    found: dict[str, int] = {}
    # prev: the byte before `buf` (a line end at the file's start); head: the first byte of the line `buf` starts
    # inside (b"": `buf` starts a line); carry: from a '>' whose name the block cut, read again with the next
    lines, prev, head, carry = 0, b"\n", b"", b""
    with decompressed(path) as fh:
        while len(found) < len(wanted):
            data = fh.read(block)
            buf = carry + data if carry else data
            at = buf.find(b">")
            while at >= 0 and (not data or at + longest < len(buf)):
                before = buf[at - 1:at] if at else prev
                if before not in (b"\n", b"\r") and (name := _header_named(buf, at, wanted)) not in (None, *found):
                    start = _line_start(buf, at)
                    if (buf[start:start + 1] if start else head or buf[:1]) != b">":  # not inside a header line
                        found[name] = lines + buf.count(b"\n", 0, at) + 1
                at = buf.find(b">", at + 1)
            if not data:
                break
            cut = len(buf) if at < 0 else at
            start = _line_start(buf, cut)
            head = buf[start:start + 1] if start else head or buf[:1]
            prev = buf[cut - 1:cut] if cut else prev
            lines, carry = lines + buf.count(b"\n", 0, cut), buf[cut:]
    return found


def _header_named(buf: bytes, at: int, wanted: dict[bytes, str]) -> str | None:
    """The name of `wanted` ({'>' + name: name}) whose header starts at `buf[at]`, ended by a blank, a line end
    or the end of `buf`; None if none."""
    for needle, name in wanted.items():
        end = at + len(needle)
        if buf.startswith(needle, at) and (end == len(buf) or buf[end:end + 1] in NAME_ENDS):
            return name
    return None


def _line_start(buf: bytes, at: int) -> int:
    """Where in `buf` the line holding byte `at` starts (after a LF or CR); 0 where it starts before `buf`."""
    return max(buf.rfind(b"\n", 0, at), buf.rfind(b"\r", 0, at)) + 1


def fai_parses(fai: Path) -> bool:
    """Whether pyfaidx can read a .fai as it reads one (each line, right-stripped, five tab-separated fields, the
    last four integers; a repeated name is an error there): UTF-8, at most MAX_FAI_BYTES, each number within
    MAX_BYTES (pyfaidx computes with them in floating point), names unique. One it cannot read (a torn or
    garbled index), or this user cannot, is built again: pyfaidx's ValueError would name the FASTA, which may be
    sound, and its PermissionError was a traceback."""
    try:
        text = read_text(fai, MAX_FAI_BYTES)
    except LcftError:  # unreadable, larger, not UTF-8
        return False
    if FAI_TEXT.fullmatch(text):  # the common form, at C speed: what remains is whether names repeat
        listed = FAI_NAME.findall(text)
        return len(set(listed)) == len(listed)
    return fai_text_parses(text)


def fai_text_parses(text: str) -> bool:
    """`fai_parses` of a .fai's text, a line at a time: the reference its regex for the common form is held to."""
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
    one that does not fit, or that this user cannot read, is built again. Its size is that of the bytes read (one
    grown since its size was looked at reads as too large)."""
    compressed = bgzf.stat().st_size
    most = 8 + 16 * (compressed // BGZF_MIN_BLOCK)  # bytes of an index of as many blocks as the file could hold
    try:
        data = read_bytes(gzi, most)
    except LcftError:  # unreadable, or larger
        return False
    size = len(data)
    if size < 8 or size > most or (size - 8) % 16 or struct.unpack_from("<Q", data)[0] != (size - 8) // 16:
        return False
    starts = [(0, 0), *struct.iter_unpack("<QQ", data[8:])]
    with bgzf.open("rb") as fh:
        fd = fh.fileno()
        for (c0, u0), (c1, u1) in zip(starts, starts[1:], strict=False):
            length = _block_length(fd, c0)
            if length is None or c0 + length != c1 or u0 + isize(fd, c1) != u1:
                return False
        return starts[-1][0] < compressed and _block_length(fd, starts[-1][0]) is not None


def _block_length(fd: int, at: int) -> int | None:
    """Bytes of the BGZF block starting at byte `at` (its BC extra field's size + 1); None when no BGZF block
    header starts there."""
    head = os.pread(fd, 18, at) if at < MAX_BYTES else b""
    if len(head) < 18 or head[:4] != b"\x1f\x8b\x08\x04" or head[12:14] != b"BC":
        return None
    return struct.unpack_from("<H", head, 16)[0] + 1


def isize(fd: int, end: int) -> int:
    """The uncompressed size (mod 2^32) a gzip member ending at byte `end` records in its last 4 bytes (gzip's
    ISIZE; a BGZF block is one member); -1 where there are no 4 bytes."""
    tail = os.pread(fd, 4, end - 4)
    return struct.unpack("<I", tail)[0] if len(tail) == 4 else -1


def not_a_fasta_file(p: Path) -> LcftError | None:
    """Why an existing `p` is no FASTA file to read, or None: a folder (a windows folder, a genome's folder), not a
    regular file, or a FASTA's index (.fai, .gzi) given for the FASTA beside it."""
    if p.is_dir():
        return LcftError(f"FASTA {p} is a folder: give the FASTA file itself (.fa, .fa.gz, ...)")
    if not p.is_file():
        return LcftError(f"FASTA {p} is not a regular file")
    if p.suffix in (".fai", ".gzi") and p.with_suffix("").is_file():
        return LcftError(f"FASTA {p} is the index of {p.with_suffix('')}: give that file")
    return None


def meant_name(name: str, names: list[str]) -> str | None:
    """The record `name` was likely meant for: the same name with or without UCSC's 'chr' (hg38 'chr1', Ensembl
    '1'), the mitochondrion by its other name (chrM, MT), a contig by UCSC's or Ensembl's name (`ucsc_accession`), in another case, or one field of a name like 'gi|9626243|ref|NC_001416.1|' (with or without its
    version); else the closest spelling (lcft.errors.closest, among at most the first 100,000 names: an assembly
    of contigs has millions)."""
    low = name.lower()
    alias = low[3:] if low.startswith("chr") else "chr" + low
    aliases = MITOCHONDRION if low in MITOCHONDRION else (low, alias, ucsc_accession(low))
    for have in names:
        fields = have.lower().split("|")
        if (have.lower() in aliases or low in fields or low in (f.partition(".")[0] for f in fields)
                or ucsc_accession(have.lower()) == low):
            return have
    return closest(name, names[:100_000])


def ucsc_accession(low: str) -> str:
    """The GenBank accession (Ensembl's name) of a lower-case UCSC name of an unplaced, unlocalized or alternate
    contig ('chrun_ki270302v1' -> 'ki270302.1', 'chr1_ki270706v1_random' -> 'ki270706.1'); else ''."""
    m = UCSC_CONTIG.fullmatch(low)
    return f"{m[1]}.{m[2]}" if m else ""


def missing_names_error(path: Path, missing: list[str], names: list[str], source: Path | None = None) -> LcftError:
    """One line naming the records of `missing` the FASTA lacks, what each was likely meant to be (the first
    three), and the records it has (the first 30); where one of the first three is a header joined to the line
    before it (`glued_headers` of `source`, the bytes indexed, unless compressed; `path` itself when None), that
    line and the mend instead of a guess."""
    source = source or path
    try:  # (an error already: the good path never reads for it). Not a BGZF: a mistyped name in a genome would wait
        # the minute its inflation takes (~14 ns/byte) for a cause this rare; a plain file is read at disk speed
        glued = {} if packed(source) else glued_headers(source, missing[:3])
    except OSError:
        glued = {}

    def one(m: str) -> str:
        meant = meant_name(m, names) if missing.index(m) < 3 and m not in glued else None
        return m + did_you_mean(meant)

    shown = ", ".join(names[:30]) + (f", ... ({len(names)} in all)" if len(names) > 30 else "")
    # a name holding a comma reaches here cut at it (--train, --eval and a TOML string split there; a list does not)
    cut = next((n for n in names if "," in n and any(m in n.split(",") for m in missing)), None)
    hint = "" if cut is None else (f"; record {cut!r} holds a comma, at which --train and --eval split their names: "
                                   f"give it in a --config TOML list, e.g. train = [{json.dumps(cut)}]")
    if glued:  # the first one the file holds glued inside a sequence line: the index read it as bases
        name, line = min(glued.items(), key=lambda kv: kv[1])
        hint += f"; {joined_cause(f'line {line}', repr('>' + name))}"
    return LcftError(f"chromosome {', '.join(map(one, missing))} not found in {path}; available: {shown}{hint}")
