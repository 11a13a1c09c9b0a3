"""lcft's index builders against pyfaidx's (the oracle): the same .fai (and for BGZF the same .gzi) bytes for every
file of the plain layout, at any block size and BGZF block boundaries (records, lines and headers cut across
reads); nothing written for any other file, which pyfaidx then indexes and judges as before."""

from __future__ import annotations

import gzip
import random
import shutil
from pathlib import Path

import pyfaidx
import pytest
from Bio import bgzf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcft.genomics import fai_build
from lcft.genomics.fai_build import build_bgzf_index, build_fai

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
        assert build_fai(path, tmp_path / "ours.fai")
        assert (tmp_path / "ours.fai").read_bytes() == _pyfaidx_fai(path, tmp_path / "theirs.fai")


@st.composite
def plain_fasta(draw) -> str:
    """1-5 records of 1-3,000 bases (case, N), each wrapped at its own width, headers with descriptions, a blank
    line after some (pyfaidx allows one)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    parts = []
    for r in range(rng.randint(1, 5)):
        n, width = rng.choice([1, 5, 59, 60, 61, 121, 500, 3000]), rng.choice([1, 7, 60, 61, 80])
        seq = "".join(rng.choices("ACGTacgtNn", k=n))
        parts.append(f">r{r}{rng.choice(['', ' d e s c', chr(9) + 'x', ' ' + 'L' * 300, chr(0x1c) + 'x'])}\n")
        parts += [seq[i:i + width] + "\n" for i in range(0, n, width)] + ["\n"] * (rng.random() < 0.2)
    return "".join(parts)


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=plain_fasta(), block=st.sampled_from([7, 64, 1000, 1 << 24]))
def test_plain_files_index_as_pyfaidx_does_at_any_block_size(tmp_path_factory, text, block):
    d = tmp_path_factory.mktemp("plain")
    path = d / "x.fa"
    path.write_text(text)
    old, fai_build.BLOCK = fai_build.BLOCK, block
    try:
        assert build_fai(path, d / "ours.fai")
    finally:
        fai_build.BLOCK = old
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
    assert build_bgzf_index(path, d / "ours.fai", d / "ours.gzi")
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
    "CRLF": ">a\r\nACGT\r\nAC\r\n",
    "text before the first header": ";c\n>a\nACGT\n",
    "a record without bases": ">a\n>b\nACGT\n",
    "a last line longer": ">a\nACGT\nACGTA\n",
    "a middle line shorter": ">a\nACGT\nACG\nACGT\n",
    "same names": ">a\nACGT\n>a x\nACGT\n",
    "no last line break": ">a\nACGT\nAC",
    "non-ASCII base": ">a\nAC\u00e9T\n",
    "non-ASCII header": ">\u00e9\nACGT\n",
    "a header without a name": "> \nACGT\n",
    "empty": "",
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_any_other_file_is_left_to_pyfaidx(tmp_path, case):
    path = tmp_path / "x.fa"
    path.write_text(OTHERS[case], encoding="utf-8")
    assert not build_fai(path, tmp_path / "ours.fai")
    assert not (tmp_path / "ours.fai").exists()
