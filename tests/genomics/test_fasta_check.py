"""A FASTA whose bytes are not UTF-8 text: the refusal names its line, as Biopython (reading UTF-8 text) fails on it."""

from __future__ import annotations

import gzip

import pytest
from Bio import bgzf

from lcft.errors import LcftError
from lcft.genomics import prepare_windows
from lcft.genomics.fasta_check import non_utf8_line
from tests.genomics.conftest import bio_records, random_genome, write_fasta


def _first_bad_line(data: bytes) -> int | None:
    """The oracle: each line decoded on its own."""
    for k, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return k
    return None


@pytest.mark.parametrize("kind", ["plain", "gzip", "bgzf"])
def test_a_latin1_header_is_refused_naming_its_line(tmp_path, kind):
    """'Müller' saved as Latin-1 in the second record's header (line 5): the error had said only the byte's
    position in a line it did not name."""
    good = write_fasta(tmp_path / "g.fa", {"c1": random_genome(1, 180, n_runs=0), "c2": random_genome(2, 120)})
    data = good.read_bytes().replace(b">c2\n", ">c2 Müller lab\n".encode("latin-1"), 1)
    assert _first_bad_line(data) == 5
    path = tmp_path / ("bad.fa" if kind == "plain" else "bad.fa.gz")
    if kind == "gzip":
        path.write_bytes(gzip.compress(data))
    elif kind == "bgzf":
        with bgzf.BgzfWriter(str(path), "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    with pytest.raises(UnicodeDecodeError):  # Biopython cannot read it either
        bio_records(path)
    out = tmp_path / "out"
    with pytest.raises(LcftError, match=r"bad\.fa(\.gz)?: line 5 is not UTF-8 text \(.*0xfc.*\); re-encode") as e:
        prepare_windows(fasta=str(path), out=str(out), length=64, train=("c1",), eval=())
    assert "\n" not in str(e.value) and not out.exists()


def test_non_utf8_line_across_blocks(tmp_path):
    """Read in blocks of 7 bytes, so a character of several bytes is split between blocks: the line is the one
    each line decoded on its own gives (the oracle), or None."""
    texts = [">é\nACGT\n>ü x\nAC\n", ">a\nAC\n>b \xfc\nAC\n", ">a\nACGT\n>b\n" + "AC\n" * 9 + ">\u20ac\xe9\n",
             ">a\nAC\n>z"]
    for k, text in enumerate(texts):
        data = text.encode("utf-8") if k != 1 else text.encode("latin-1")
        for cut in (0, 1, 2):  # also a file ending inside a character
            raw = data[: len(data) - cut] if k == 2 else data
            path = tmp_path / f"t{k}{cut}.fa"
            path.write_bytes(raw)
            assert non_utf8_line(path, block=7) == _first_bad_line(raw), (text, cut)
