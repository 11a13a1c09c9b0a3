"""lcft's .fai builder against pyfaidx's (the oracle): the same bytes for every file of the plain layout, at any
block size (records, lines and headers cut across reads); nothing written for any other file, which pyfaidx then
indexes and judges as before."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyfaidx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcft.genomics import fai_build
from lcft.genomics.fai_build import build_fai

GENOMES = Path(__file__).resolve().parents[3] / "shared" / "genomes"
PLAIN = ["lambda_phage_NC_001416.1.fa", "sacCer3_chrIV.fa", "human_chrM_GRCh38_ensembl_dna_sm.fa",
         "grch37_chr22_20000001-21000000.fa"]


def _pyfaidx_fai(path: Path, out: Path) -> bytes | None:
    try:
        pyfaidx.Faidx(str(path), indexname=str(out)).close()
    except pyfaidx.FastaIndexingError:
        return None
    return out.read_bytes()


@pytest.mark.parametrize("name", PLAIN)
def test_published_genomes_index_as_pyfaidx_does(tmp_path, name):
    if not (GENOMES / name).is_file():
        pytest.skip(f"genomes not found at {GENOMES}")
    path = tmp_path / name
    shutil.copy(GENOMES / name, path)
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
