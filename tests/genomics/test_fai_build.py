"""lcft's index builders against pyfaidx's (the oracle): the same .fai (and for BGZF the same .gzi) bytes for every
file of the plain layout (LF or CRLF, the last line ended or not), at any block size and BGZF block boundaries
(records, lines and headers cut across reads); for any other file, read a line at a time in pieces of any size,
the same index or the same error; and memory that does not grow with a file's longest line."""

from __future__ import annotations

import gzip
import os
import random
import shutil
import textwrap
from itertools import chain
from pathlib import Path

import pyfaidx
import pytest
from Bio import bgzf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcft.genomics import fai_build, fai_lines
from lcft.genomics.fai_build import build_bgzf_index, build_fai
from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture, by name)

GENOMES = Path(__file__).resolve().parents[3] / "shared" / "genomes"
PLAIN = ["lambda_phage_NC_001416.1.fa", "sacCer3_chrIV.fa", "human_chrM_GRCh38_ensembl_dna_sm.fa",
         "grch37_chr22_20000001-21000000.fa"]


def _pyfaidx_fai(path: Path, out: Path) -> bytes | None:
    """pyfaidx's .fai of `path` (and beside `out`, for BGZF, its .gzi), or None when it refuses the file."""
    gzi = {"gzi_indexname": str(out.with_suffix(".gzi"))} if path.name.endswith(".gz") else {}
    try:
        pyfaidx.Faidx(str(path), indexname=str(out), **gzi).close()
    except pyfaidx.FastaIndexingError:
        return None
    return out.read_bytes()


def _opened(path: Path, fai: Path, build=None) -> bytes | tuple[str, str]:
    """The .fai (and .gzi) pyfaidx opens `path` with, built by `build` first (None: by pyfaidx), or its error as
    (type, message): a line that is not UTF-8 is pyfaidx's UnicodeDecodeError, a ValueError of the same text."""
    gzi = fai.with_suffix(".gzi")
    try:
        if build is not None:
            build(path, fai, gzi) if path.name.endswith(".gz") else build(path, fai)
            assert fai.is_file(), "the builder wrote no index (pyfaidx would build its own)"
        named = {"gzi_indexname": str(gzi)} if path.name.endswith(".gz") else {}
        pyfaidx.Faidx(str(path), indexname=str(fai), **named).close()
    except (ValueError, RuntimeError, pyfaidx.FastaIndexingError) as e:
        return ("ValueError" if isinstance(e, ValueError) else type(e).__name__, str(e))
    return fai.read_bytes() + (gzi.read_bytes() if gzi.exists() else b"")


def _written(folder: Path, data: bytes, bgzf_file: bool) -> Path:
    """`data` as x.fa, or BGZF-compressed as x.fa.gz."""
    path = folder / ("x.fa.gz" if bgzf_file else "x.fa")
    if bgzf_file:
        with bgzf.BgzfWriter(str(path), "wb") as w:
            w.write(data)
    else:
        path.write_bytes(data)
    return path


def _no_line_path(*a):
    raise AssertionError("read a line at a time: not the plain layout")


@pytest.mark.parametrize("name", PLAIN + ["hg38_chr2_1-2333275.fa.gz"])
def test_published_genomes_index_as_pyfaidx_does(tmp_path, name):
    if not (GENOMES / name).is_file():
        pytest.skip(f"genomes not found at {GENOMES}")
    path = tmp_path / name
    shutil.copy(GENOMES / name, path)
    if name.endswith(".gz"):  # BGZF
        assert build_bgzf_index(path, tmp_path / "ours.fai", tmp_path / "ours.gzi")
        assert (tmp_path / "ours.fai").read_bytes() == _pyfaidx_fai(path, tmp_path / "theirs.fai")
        assert (tmp_path / "ours.gzi").read_bytes() == (tmp_path / "theirs.gzi").read_bytes()
    else:
        build_fai(path, tmp_path / "ours.fai")
        assert (tmp_path / "ours.fai").read_bytes() == _pyfaidx_fai(path, tmp_path / "theirs.fai")


@st.composite
def plain_fasta(draw) -> str:
    """1-5 records of 1-3,000 bases (case, N), each wrapped at its own width, headers with descriptions, a blank
    line after some (pyfaidx allows one), LF or CRLF line ends (no blank lines then), the last line unended in
    some."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    eol, parts = rng.choice(["\n", "\r\n"]), []
    for r in range(rng.randint(1, 5)):
        n, width = rng.choice([1, 5, 59, 60, 61, 121, 500, 3000]), rng.choice([1, 7, 60, 61, 80])
        seq = "".join(rng.choices("ACGTacgtNn", k=n))
        parts.append(f">r{r}{rng.choice(['', ' d e s c', chr(9) + 'x', ' ' + 'L' * 300, chr(0x1c) + 'x'])}{eol}")
        parts += [seq[i:i + width] + eol for i in range(0, n, width)] + [eol] * (eol == "\n" and rng.random() < 0.2)
    text = "".join(parts)
    return text.removesuffix(eol) if text.endswith(seq[-1] + eol) and rng.random() < 0.3 else text


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=plain_fasta(), block=st.sampled_from([7, 64, 1000, 1 << 24]))
def test_plain_files_index_as_pyfaidx_does_at_any_block_size(tmp_path_factory, text, block):
    d = tmp_path_factory.mktemp("plain")
    path = d / "x.fa"
    path.write_text(text)
    old, fai_build.BLOCK, by_lines, fai_build.index_rows = fai_build.BLOCK, block, fai_build.index_rows, _no_line_path
    try:
        build_fai(path, d / "ours.fai")
    finally:
        fai_build.BLOCK, fai_build.index_rows = old, by_lines
    assert (d / "ours.fai").read_bytes() == _pyfaidx_fai(path, d / "theirs.fai")


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=plain_fasta(), cuts=st.lists(st.integers(1, 9000), min_size=1, max_size=12))
def test_bgzf_files_index_as_pyfaidx_does_whatever_their_blocks(tmp_path_factory, text, cuts):
    """BGZF blocks ending where `cuts` say (inside lines and headers too): the same .fai and .gzi."""
    d = tmp_path_factory.mktemp("bgzf")
    path, data, at = d / "x.fa.gz", text.encode(), 0
    with bgzf.BgzfWriter(str(path), "wb") as w:
        for cut in cuts:
            w.write(data[at:at + cut])
            w.flush()  # one block per piece
            at += cut
        w.write(data[at:])
    by_lines, fai_build.index_rows = fai_build.index_rows, _no_line_path
    try:
        assert build_bgzf_index(path, d / "ours.fai", d / "ours.gzi")
    finally:
        fai_build.index_rows = by_lines
    assert (d / "ours.fai").read_bytes() == _pyfaidx_fai(path, d / "theirs.fai")
    assert (d / "ours.gzi").read_bytes() == (d / "theirs.gzi").read_bytes()


def test_a_damaged_bgzf_is_left_to_pyfaidx(tmp_path):
    """A block whose CRC does not match, a cut file, a plain gzip member after a BGZF one: nothing written."""
    good = tmp_path / "g.fa.gz"
    with bgzf.BgzfWriter(str(good), "wb") as w:
        w.write(">a\n" + "ACGT" * 1000 + "\n")
    data = good.read_bytes()
    crc = bytearray(data)
    crc[data.index(b"BC") + 20] ^= 0xFF  # a byte of the first block's deflate stream
    for name, bad in (("crc", bytes(crc)), ("cut", data[:-30]), ("member", data + gzip.compress(b">b\nACGT\n"))):
        path = tmp_path / f"{name}.fa.gz"
        path.write_bytes(bad)
        assert not build_bgzf_index(path, tmp_path / f"{name}.fai", tmp_path / f"{name}.gzi"), name
        assert not (tmp_path / f"{name}.fai").exists() and not (tmp_path / f"{name}.gzi").exists()


OTHERS = {  # each: not the plain layout (pyfaidx takes some, refuses others; lcft then judges them as before)
    "blank line inside a record": ">a\nACGT\n\nACGT\n",
    "two blank lines between records": ">a\nACGT\n\n\n>b\nACGT\n",
    "a blank line first": ">a\n\nACGT\n",
    "CRLF with a blank line ending a record": ">a\r\nACGT\r\nAC\r\n\r\n>b\r\nAC\r\n",
    "CRLF among LF": ">a\nACGT\nAC\r\n",
    "LF among CRLF": ">a\r\nACGT\r\nAC\n",
    "a CR alone": ">a\nAC\rGT\n",
    "a CR last": ">a\r\nACGT\r",
    "text before the first header": ";c\n>a\nACGT\n",
    "a record without bases": ">a\n>b\nACGT\n",
    "a header last, unended": ">a\nACGT\n>b",
    "a last line longer": ">a\nACGT\nACGTA\n",
    "an unended last line longer": ">a\nACGT\nACGTA",
    "an unended base after a short line": ">a\nACGT\nAC\nA",
    "a middle line shorter": ">a\nACGT\nACG\nACGT\n",
    "same names": ">a\nACGT\n>a x\nACGT\n",
    "non-ASCII base": ">a\nAC\u00e9T\n",
    "non-ASCII header": ">\u00e9\nACGT\n",
    "a header without a name": "> \nACGT\n",
    "empty": "",
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_any_other_file_is_indexed_or_refused_as_pyfaidx_does(tmp_path, case):
    """Read a line at a time in pieces of 1, 2, 3 and 2**20 bytes: pyfaidx's index, or its error."""
    path = tmp_path / "x.fa"
    path.write_text(OTHERS[case], encoding="utf-8")
    want = _opened(path, tmp_path / "theirs.fai")
    for piece in (1, 2, 3, 1 << 20):
        old, fai_build.PIECE = fai_build.PIECE, piece
        try:
            assert _opened(path, tmp_path / f"ours{piece}.fai", build_fai) == want, piece
        finally:
            fai_build.PIECE = old


LINE_PARTS = [b">a", b">b x", b"> ", b";c", b"ACGT", b"AC", b"A", b"\n", b"\n", b"\r\n", b"\r", b" ", b"\t", b"\x1c",
              b"\xc3\xa9", b"\xe9", b"\xe2\x82"]


def test_random_text_is_indexed_or_refused_as_pyfaidx_does(tmp_path):
    """4,000 random texts of headers, comments, bases, line ends, blanks, UTF-8 and bytes that are not, at random
    block and piece sizes, plain and (500) BGZF: pyfaidx's .fai (and .gzi), or its error, every time."""
    rng = random.Random(0)
    old = fai_build.BLOCK, fai_build.PIECE
    try:
        for k in range(4000):
            data = b">r\n" * (rng.random() < 0.5) + b"".join(rng.choices(LINE_PARTS, k=rng.randrange(1, 30)))
            path = _written(tmp_path, data, bgzf_file=k % 8 == 0)
            fai_build.BLOCK, fai_build.PIECE = rng.choice([3, 7, 64, 1 << 24]), rng.choice([1, 2, 3, 5, 1 << 20])
            want = _opened(path, tmp_path / f"theirs{k}.fai")
            assert _opened(path, tmp_path / f"ours{k}.fai", build_bgzf_index if k % 8 == 0 else build_fai) == want, data
    finally:
        fai_build.BLOCK, fai_build.PIECE = old


ODD_LINES = [b"\n", b"\r\n", b";c\n", b" AC\n", b"\tA\n", b"AC\n", b"A\r\r\n", b"A\rC\n", b">x\n", b"> \n",
             b"\xc3\xa9A\n", b"\xe9\n", b"ACGTACGTACGTA\n"]


def _wrapped(rng: random.Random) -> bytes:
    """Records wrapped at one width each (LF or CRLF), long enough for Runs of equal lines, their lines starting now
    and then with ';' or '>', and now and then a line of another kind (blank, short, long, CRs, non-ASCII, the
    other line end in as many bytes)."""
    parts = [rng.choice([b"", b";c\n", b"\n", b" \n", b"ACGT\n", b"ACGT\n" * 20, b";cc\n" * 20, b" \t\n" * 20])]
    for r in range(rng.randrange(1, 4)):
        parts.append(rng.choice([b">r%d\n" % r, b">r%d x\r\n" % r]))
        width, eol = rng.randrange(1, 12), rng.choice([b"\n", b"\r\n"])
        for _ in range(rng.randrange(0, 150)):
            parts.append(bytes(rng.choices(b"ACGTN;>", weights=[9, 9, 9, 9, 3, 1, 1], k=width)) + eol)
            if rng.random() < 0.02:
                parts.append(rng.choice(ODD_LINES))
            elif rng.random() < 0.02 and width > 2:  # as many bytes, another line end: a base or two more or less
                other = [b"A" * (width + 1) + b"\n", b"A" * (width - 1) + b"\r\r\n"] if eol == b"\r\n" else [
                    b"A" * (width - 1) + b"\r\n", b"A" * (width - 2) + b"\r\r\n"]
                parts.append(rng.choice(other))
        parts.append(bytes(rng.choices(b"ACGT", k=rng.randrange(1, width + 2))) + eol)
        parts.append(rng.choice([b"", b"", b"\n", eol + eol]))
    data = b"".join(parts)
    return data[:-1] if rng.random() < 0.1 else data


def test_runs_of_equal_lines_are_indexed_or_refused_as_pyfaidx_does(tmp_path, monkeypatch):
    """1,500 random wrapped texts (plain and, one in 8, BGZF), read in pieces of random sizes: pyfaidx's .fai, or
    its error (with its line number), every time, with most texts read partly as Runs of equal lines."""
    runs, by_runs = [0], fai_lines._runs

    def counted(data: bytes) -> list:
        got = by_runs(data)
        runs[0] += sum(type(text) is fai_lines.Run for _, _, text in got)
        return got

    monkeypatch.setattr(fai_lines, "_runs", counted)
    rng = random.Random(1)
    for k in range(1500):
        data = _wrapped(rng)
        path = _written(tmp_path, data, bgzf_file=k % 8 == 0)
        monkeypatch.setattr(fai_build, "BLOCK", rng.choice([64, 1 << 24]))
        monkeypatch.setattr(fai_build, "PIECE", rng.choice([7, 64, 300, 4096, 1 << 20]))
        want = _opened(path, tmp_path / f"theirs{k}.fai")
        assert _opened(path, tmp_path / f"ours{k}.fai", build_bgzf_index if k % 8 == 0 else build_fai) == want, data
    assert runs[0] > 1500


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[k:k + size] for k in range(0, len(data), size)]


def test_a_wrapped_record_is_read_a_run_of_lines_at_a_time():
    """60 bases a line behind a comment: a few items per piece, not one per line, and pyfaidx's row; a header too
    long after such runs is told at its own line's number."""
    text = b";c\n>a x\n" + (b"ACGT" * 15 + b"\n") * 50_000 + b"AC\n"
    pieces = _pieces(text, 1 << 16)
    assert len(list(chain.from_iterable(fai_lines.lines(pieces)))) < 4 * len(pieces)
    assert fai_lines.index_rows("x", pieces) == [("a", 60 * 50_000 + 2, 8, 60, 61)]
    long = text + b">" + b"A" * (fai_lines.MAX_HEADER + (1 << 17)) + b"\n"  # unended a piece past it
    with pytest.raises(fai_lines.LongHeader, match=f"^line {2 + 50_000 + 1 + 1} is a header over"):
        fai_lines.index_rows("x", _pieces(long, 1 << 16))


PEAK = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from lcft.genomics.fasta import FastaFile
    from lcft.train.metrics import peak_memory_bytes
    before = peak_memory_bytes(torch.device("cpu"))
    with FastaFile(Path(sys.argv[1])) as fasta:
        print(peak_memory_bytes(torch.device("cpu")) - before, fasta.length(fasta.names[-1]))
""")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc")
@pytest.mark.parametrize("head, end", [(b">a\r\n", b"\r\n"), (b">a\n", b""), (b">a x\r\nACGT\r\n>b\r\n", b""),
                                       (b";c\n>a\n", b"\n"), (b">a\r\nACGT\r\n\r\n>b\r\n", b"\r\n")])
def test_opening_a_fasta_of_one_long_line_holds_no_line_whole(preloaded, tmp_path, head, end):  # noqa: F811
    """A record of one 64 MiB line: CRLF, unended (LF, CRLF), and two files of other layouts (a comment first, a
    blank CRLF line), which are read a line at a time. Opening it raises the peak RSS by under 40 MiB: the numpy
    builder's 16 MiB block and its line-break mask, whatever the line (pyfaidx, reading each line whole and decoding
    it, raised it by 130 to 190 MiB)."""
    line = 64 << 20
    path = tmp_path / "long.fa"
    with open(path, "wb") as fh:
        fh.write(head)
        for _ in range(line >> 20):
            fh.write(b"ACGT" * (1 << 18))
        fh.write(end)
    # Forked from the module's preloaded process (torch imported once): a forked child's VmHWM starts at its own RSS.
    got = preloaded.run(["-c", PEAK, str(path)], env={**os.environ, "LCFT_CACHE": str(tmp_path / "cache")})
    assert got.returncode == 0, got.stderr[-2000:]
    grown, bases = (int(v) for v in got.stdout.split())
    assert bases == line
    assert grown < 40 << 20, f"{grown / 2**20:.0f} MiB"
