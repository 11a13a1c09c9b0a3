"""The index checks at open (lcft.genomics.fasta_scan, fasta_check): the numpy path says what the record-by-record
check says, on FASTA files as tools write them and on the same files and indexes damaged, and the .fai regex
what reading a .fai a line at a time says. Oracles: `_scan_records` with every record read on its own (itself
held to Biopython's reading by tests/genomics/test_fasta_text.py), `fai_text_parses`."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from lcft.errors import LcftError
from lcft.genomics import fasta_check, fasta_scan
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_scan import IndexScan, Reads, scan_index

CASES = 400  # about 1.2 s on 2 AMD EPYC cores; by hand, 20,000 found no difference


def _fasta_text(rng: random.Random) -> str:
    """1-40 records as tools write them: LF or CRLF, 0-300 bases each wrapped at a width of its own, descriptions
    after a space or tab; in half the files, now and then a name that is not plain (after it a \x1c, which splits
    it as a space does), an empty record, a blank line between records or a blank ending a line."""
    eol, odd = rng.choice(["\n", "\r\n"]), 0.05 * (rng.random() < 0.5)
    parts = [rng.choice(["", "", eol])]
    for r in range(rng.randint(1, 40)):
        odd_name = rng.random() < odd
        name = rng.choice([f"r{r}\x1cx", f"r{r}{chr(0xa0)}"] if odd_name else [f"r{r}", f"é{r}", f"r{r}>"])
        parts.append(f">{name}{rng.choice(['', ' desc', chr(9) + 'x y', ' '])}{eol}")
        n, width = rng.choice([1, 5, 60, 61, 121, 300]) * (rng.random() >= odd), rng.choice([1, 7, 60, 61])
        seq = "".join(rng.choices("ACGTacgtNn", k=n))
        parts += [seq[i:i + width] + (" " if rng.random() < odd / 5 else "") + eol for i in range(0, n, width)]
        parts += [eol] * (rng.random() < odd)
    return "".join(parts)


def _damage(rng: random.Random, f: FastaFile, path: Path) -> None:
    """One change the index no longer fits, or none: a record's numbers or name changed in the open index (its
    whole header line for its name, as a .fai written by another tool may have it), or a byte of the file
    inserted, dropped or replaced under it (a blank for the last base of a record's first line)."""
    kind = rng.choice(["none", "none", "offset", "rlen", "lenc", "lenb", "name", "header", "swap", "insert", "drop",
                       "byte", "blank"])
    names = f.names
    name = rng.choice(names)
    rec = f.index[name]
    data = bytearray(path.read_bytes())
    if kind in ("offset", "rlen", "lenc", "lenb"):
        numbers = {**rec._asdict(), kind: max(0, getattr(rec, kind) + rng.choice([-2, -1, 1, 2]))}
        f.index[name] = type(rec)(**numbers)  # (IndexRecord's own __len__ breaks _replace)
    elif kind in ("name", "header"):
        header = bytes(data[:rec.offset - 1]).rsplit(b"\n", 1)[-1].rstrip(b"\r")[1:].decode("utf-8", "replace")
        f.index[header if kind == "header" else rng.choice([name + "x", name[:-1] or "y", "é"])] = f.index.pop(name)
    elif kind == "swap" and len(names) > 1:
        other = rng.choice(names)
        f.index[name], f.index[other] = f.index[other], f.index[name]
    elif kind in ("insert", "drop", "byte", "blank") and f.readable == path:
        at = rec.offset + min(rec.lenc, rec.rlen) - 1 if kind == "blank" else rng.randrange(len(data))
        if kind == "drop":
            del data[at]
        else:
            data[at: at + (kind != "insert")] = b" " if kind == "blank" else rng.choice(
                [b">", b"\n", b"\r", b" ", b"\t", b"A", b"\xff"])
        path.write_bytes(bytes(data))  # (the same inode: the open file reads the new bytes)


def _scans(f: FastaFile, monkeypatch, read_most: int) -> tuple[IndexScan, IndexScan, bool]:
    """(the scan with the numpy path tried whatever the records per read, its reads ending every `read_most` bytes
    of the file, the scan record by record, whether the numpy path accepted every read)."""
    accepted = []
    fits = fasta_scan._read_fits

    def tried(*args) -> bool:
        accepted.append(fits(*args))
        return accepted[-1]

    with monkeypatch.context() as m:
        m.setattr(fasta_scan, "PLAIN_RECORDS", 0)
        m.setattr(fasta_scan, "READ_MOST", read_most)
        m.setattr(fasta_scan, "_read_fits", tried)
        fast = _outcome(f)
    with monkeypatch.context() as m:
        m.setattr(fasta_scan, "_plain_heads", lambda *args: None)
        slow = _outcome(f)
    return fast, slow, bool(accepted) and all(accepted)


def _outcome(f: FastaFile) -> IndexScan:
    try:
        return scan_index(f)
    except LcftError as e:  # a read that fails (not on a plain file; kept for what it would say)
        return IndexScan(f"error: {e}", None)


def test_numpy_path_says_what_the_record_loop_says(tmp_path, monkeypatch):
    rng, accepted, fit = random.Random(0), 0, 0
    for case in range(CASES):
        path = tmp_path / f"c{case}.fa"
        path.write_bytes(_fasta_text(rng).encode())
        try:
            f = FastaFile(path)
        except LcftError:
            continue  # refused at open (e.g. two records of one name): nothing to scan
        with f:
            _damage(rng, f, path)
            # reads of the whole file, or of 64-byte blocks of it: the records of a read numpy cannot decide
            # (their headers in the read before, or their first lines' ends in the next) are checked one by one
            fast, slow, took = _scans(f, monkeypatch, rng.choice([fasta_scan.READ_MOST, 64]))
            assert fast == slow, (case, path.read_bytes()[:400])
            if f.readable == path:  # (one read through its normalized copy had blank lines: counted apart)
                accepted += took
                fit += slow == IndexScan(None, None)
    # the numpy path decided most of the files read as they are that fit (not those with an empty record or a
    # name that is not plain)
    assert accepted > 0.5 * fit and fit > 0.1 * CASES, (accepted, fit)


@pytest.mark.parametrize("damage", ["blank", "header"])
def test_only_the_records_of_a_read_numpy_cannot_decide_are_checked_one_by_one(tmp_path, monkeypatch, damage):
    """2,000 records in reads of 4 KiB, one of them damaged: a blank ending its first line (the scan goes on to the
    end) or another name in its header (the scan stops there). Only the records of its read are checked a record
    at a time, the file is read once, and the scan says what the record-by-record check says."""
    path = tmp_path / "many.fa"
    path.write_text("".join(f">c{i}\n{'ACGT' * 25}\n" for i in range(2000)))
    checked, read, real_scan, real_read = [], [], fasta_scan._scan_records, FastaFile.read_at

    def scan_records(fasta, recs, reads, which):
        checked.extend(which)
        return real_scan(fasta, recs, reads, which)

    with FastaFile(path) as f:
        data = bytearray(path.read_bytes())
        rec = f.index["c1500"]
        if damage == "blank":
            data[rec.offset + rec.lenc - 1] = ord(" ")
        else:
            data[rec.offset - 3] = ord("x")  # the header '>c1500' becomes '>cx500'
        path.write_bytes(bytes(data))  # (the same inode: the open file reads the new bytes)
        monkeypatch.setattr(fasta_scan, "_scan_records", scan_records)
        monkeypatch.setattr(FastaFile, "read_at", lambda self, b0, n: read.append(n) or real_read(self, b0, n))
        monkeypatch.setattr(fasta_scan, "READ_MOST", 4096)
        found = scan_index(f)
        assert 0 < len(checked) < 4096 // 105 + 2 and 1500 in checked, checked
        assert sum(read) < len(data) + fasta_scan.TAIL + 4096, (sum(read), len(data))
        monkeypatch.setattr(fasta_scan, "_plain_heads", lambda *args: None)
        assert found == scan_index(f) == (IndexScan(None, "c1500") if damage == "blank" else IndexScan(
            "no header line '>c1500' right before its first base", None))


def test_a_short_contig_assembly_is_a_few_reads(tmp_path):
    """200 records of 100 bases: the checks' 400 spans are one read; two chromosomes 10 MiB apart are two."""
    text = "".join(f">c{i}\n{'ACGT' * 25}\n" for i in range(200))
    path = tmp_path / "many.fa"
    path.write_text(text)
    with FastaFile(path) as f:
        recs = fasta_scan.Records.of(f.index)
        lo = np.stack([recs.offset - 4, recs.offset + 1], 1).ravel()  # (400,)
        assert len(Reads(f, lo, lo + 4).read_lo) == 1
    far = tmp_path / "two.fa"
    far.write_text(f">a\n{'A' * (10 << 20)}\n>b\nACGT\n")
    with FastaFile(far) as f:
        lo = np.array([0, 3, (10 << 20) + 3, (10 << 20) + 7])
        reads = Reads(f, lo, lo + 3)
        assert reads.read_lo.tolist() == [0, (10 << 20) + 3]
        assert [reads.span(i) for i in range(4)] == [b">a\n", b"AAA", b"\n>b", b"ACG"]


@pytest.mark.parametrize("records", [1, 100])
def test_an_unwrapped_genome_is_not_read_whole_at_open(tmp_path, records, monkeypatch):
    """A record on one line of 8 MiB: the scan reads its header and its line's last byte, not the line."""
    path = tmp_path / "one_line.fa"
    path.write_text("".join(f">r{i}\n{'ACGT' * (1 << 21) if i == 0 else 'ACGT'}\n" for i in range(records)))
    read = []
    real = FastaFile.read_at

    def counted(self, b0: int, n: int) -> bytes:
        read.append(n)
        return real(self, b0, n)

    monkeypatch.setattr(FastaFile, "read_at", counted)
    with FastaFile(path):
        pass
    assert sum(read) < 1 << 16, read


def test_the_fai_regex_says_what_the_line_by_line_reading_says(tmp_path):
    """`fai_parses` decides a .fai in the common form with one regex; on .fai texts mutated a character at a time
    it says what reading them a line at a time as pyfaidx does says (`fai_text_parses`)."""
    rng, fai, common = random.Random(1), tmp_path / "x.fai", 0
    alphabet = ["a", "\t", "\n", "\r", " ", "0", "9", "-", "+", "_", "\x1c", "é", "٣", "9" * 14, "9" * 15]
    for _ in range(3000):
        lines = [f"c{rng.randint(0, 3)}\t{rng.randint(0, 99)}\t1\t2\t3\n" for _ in range(rng.randint(0, 4))]
        text = list("".join(lines))
        for _ in range(rng.randint(0, 2)):
            at = rng.randint(0, len(text))
            text[at: at + rng.randint(0, 1)] = [rng.choice(alphabet)]
        fai.write_text("".join(text), newline="")
        assert fasta_check.fai_parses(fai) == fasta_check.fai_text_parses("".join(text)), "".join(text)
        common += bool(fasta_check.FAI_TEXT.fullmatch("".join(text)))
    assert 300 < common < 2700  # both ways taken


@pytest.mark.parametrize("which", [0, 1])
def test_a_header_over_the_read_limit_is_named_as_such(tmp_path, which):
    """A header line of 2 MiB (a description pasted in) was refused as a file whose records are not where its
    lines say, with advice to re-wrap it: now the header is named, and its length. Biopython reads the file."""
    from Bio import SeqIO

    head = ["r0", "r1"]
    head[which] += " " + "x" * (2 << 20)
    path = tmp_path / "long_header.fa"
    path.write_text("".join(f">{h}\n{'ACGT' * 50}\n" for h in head))
    assert [r.id for r in SeqIO.parse(path, "fasta")] == ["r0", "r1"]
    with pytest.raises(LcftError, match=rf"header line of record 'r{which}' is over 1 MiB long") as e:
        FastaFile(path)
    assert "re-wrap" not in str(e.value)
