"""A normalized copy of a FASTA holds what universal newlines and dropping the blanks ending each line make of it,
byte for byte, however its lines fall across the pieces it is read in, and is made in memory of a few pieces
whatever the length of its lines."""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lcft.genomics.fasta_cache import normalize_lines
from tests.genomics.conftest import bio_records

REPO = str(Path(__file__).resolve().parents[2])
LINE_PARTS = [b"A", b"c", b"GT", b" ", b"\t", b"  \t ", b"\r", b"\n", b"\r\n", b"\n\n", b">", b"\x0c", b"\xe9", b";"]


def _reference(data: bytes) -> bytes:
    """What the copy holds, read a line at a time as text: universal newlines (CRLF and CR as LF), then each line
    without its line end and the spaces and tabs before it, empty ones dropped, each ended by LF."""
    text = io.TextIOWrapper(io.BytesIO(data), encoding="latin-1", newline=None)
    return b"".join((kept + "\n").encode("latin-1") for line in text if (kept := line.rstrip(" \t\n")))


def _normalized(data: bytes, piece: int) -> bytes:
    out = io.BytesIO()
    normalize_lines(io.BytesIO(data), out, piece)
    return out.getvalue()


@pytest.mark.parametrize("data, want", [
    (b">a x \r\nAC GT \t\r\n\r\n  \r\nacgt\n", b">a x\nAC GT\nacgt\n"),  # CRLF, blank lines, a blank inside kept
    (b">a\rAC\r\rGT", b">a\nAC\nGT\n"),  # CR-only line ends, the last line unended
    (b">a\nAC\x0c\t\nGT \t \t", b">a\nAC\x0c\nGT\n"),  # a form feed kept; blanks ending the file dropped
    (b"\n\n \t\n>a\n\n", b">a\n"),
    (b"", b""),
])
def test_normalized_lines_are_byte_for_byte(data, want):
    """Known cases, read whole and a byte at a time (a CRLF, a run of blanks, split across pieces)."""
    for piece in (1, 2, 3, 1 << 20):
        assert _normalized(data, piece) == want, piece


def test_random_text_normalizes_as_read_a_line_at_a_time():
    """20,000 random texts of line ends, blanks, bases and other bytes, in pieces of 1 to 7 bytes and whole: the
    copy is the line-at-a-time reading's, byte for byte."""
    rng = random.Random(0)
    for _ in range(20_000):
        data = b"".join(rng.choices(LINE_PARTS, k=rng.randrange(40)))
        piece = rng.choice([1, 2, 3, 5, 7, 1 << 20])
        assert _normalized(data, piece) == _reference(data), (data, piece)


def test_long_blank_runs_are_cut_off_only_where_they_end_a_line():
    """Runs of blanks longer than a piece (written before it is known what follows them): kept before a base, cut
    off before a line end or the file's end, a line of nothing else dropped."""
    rng = random.Random(1)
    for _ in range(2_000):
        data = b"".join(rng.choice([b" " * rng.randrange(1, 30), b"\t\t", b"A", b"\n", b"\r\n", b"\r"])
                        for _ in range(rng.randrange(12)))
        assert _normalized(data, rng.choice([1, 4, 8])) == _reference(data), data


def test_a_wrapped_fasta_with_blanks_normalizes_to_biopythons_records(tmp_path):
    """A FASTA with CRLF line ends, blanks ending lines and blank lines: the copy, read in small pieces, holds the
    records Biopython reads from the file."""
    rng = random.Random(2)
    parts = []
    for i in range(20):
        seq = "".join(rng.choices("ACGTNacgtn", k=rng.randrange(1, 500)))
        lines = [seq[j:j + 61] + rng.choice(["", " ", "\t", "  "]) for j in range(0, len(seq), 61)]
        parts.append(f">r{i} about r{i} \r\n" + "".join(ln + rng.choice(["\r\n", "\r\n\r\n"]) for ln in lines))
    given = tmp_path / "given.fa"
    given.write_bytes("".join(parts).encode())
    copy = tmp_path / "copy.fa"
    copy.write_bytes(_normalized(given.read_bytes(), 97))
    assert bio_records(copy) == bio_records(given) and len(bio_records(copy)) == 20


PEAK = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from lcft.hashing import file_hash
    from lcft.genomics.fasta_cache import normalize_to_cache
    from lcft.genomics.fasta_check import gzip_kind
    from lcft.train.metrics import peak_memory_bytes
    path = Path(sys.argv[1])
    digest = file_hash(path).hexdigest()
    before = peak_memory_bytes(torch.device("cpu"))
    copy = normalize_to_cache(path, gzip_kind(path), digest)
    print(peak_memory_bytes(torch.device("cpu")) - before, copy.stat().st_size)
""")
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc")
@pytest.mark.parametrize("compress", [False, True])
def test_normalizing_a_long_line_holds_a_few_pieces_of_it(tmp_path, compress):
    """A record of one 64 MiB line, unended, behind a line ending in a blank (which sends the file to a normalized
    copy), plain and gzip: making the copy raises the peak RSS by under 16 MiB (read a line at a time, the line
    was held three times over: 200 MiB)."""
    line = 64 << 20
    path = tmp_path / ("long.fa.gz" if compress else "long.fa")
    with gzip.open(path, "wb", compresslevel=1) if compress else open(path, "wb") as fh:
        fh.write(b">a\nACGT \nACGT\n>b\n")
        for _ in range(line >> 20):
            fh.write(b"ACGT" * (1 << 18))
    out = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": REPO, "LCFT_CACHE": str(tmp_path / "cache")}).stdout.split()
    grown, size = int(out[0]), int(out[1])
    assert size == len(b">a\nACGT\nACGT\n>b\n") + line + 1
    assert grown < 16 << 20, f"{grown / 2**20:.0f} MiB"
