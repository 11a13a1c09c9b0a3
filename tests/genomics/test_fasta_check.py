"""A FASTA whose bytes are not UTF-8 text: the refusal names its line, as Biopython (reading UTF-8 text) fails on it;
one with a header joined to the sequence line before it: the refusal names that line and the cause, or, where the
joined line is as long as its record's others (the index fits), the record and base when its bases are read; a record
name holding a comma, cut at it by --train: the refusal says how to give it."""

from __future__ import annotations

import gzip
import re

import pytest
from Bio import bgzf
from tokenizers import Tokenizer, models, trainers

from lcft.errors import LcftError
from lcft.genomics import prepare_windows
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_check import glued_headers, non_utf8_line, odd_sequence_line
from lcft.genomics.inspect import inspect_fasta
from tests.genomics.conftest import bio_records, random_genome, write_fasta


def _first_bad_line(data: bytes) -> int | None:
    """The oracle: each line decoded on its own."""
    for k, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return k
    return None


def _write(path, data: bytes, kind: str) -> None:
    if kind == "gzip":
        path.write_bytes(gzip.compress(data))
    elif kind == "bgzf":
        with bgzf.BgzfWriter(str(path), "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("kind", ["plain", "gzip", "bgzf"])
def test_a_latin1_header_is_refused_naming_its_line(tmp_path, kind):
    """'Müller' saved as Latin-1 in the second record's header (line 5): the error had said only the byte's
    position in a line it did not name."""
    good = write_fasta(tmp_path / "g.fa", {"c1": random_genome(1, 180, n_runs=0), "c2": random_genome(2, 120)})
    data = good.read_bytes().replace(b">c2\n", ">c2 Müller lab\n".encode("latin-1"), 1)
    assert _first_bad_line(data) == 5
    path = tmp_path / ("bad.fa" if kind == "plain" else "bad.fa.gz")
    _write(path, data, kind)
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


@pytest.mark.parametrize("kind", ["plain", "gzip", "bgzf"])
@pytest.mark.parametrize("last", [20, 60])  # the first file's last line: shorter than the others, or as long
def test_a_header_joined_to_the_line_before_is_named(tmp_path, kind, last):
    """`cat a.fa b.fa` with a.fa lacking its final line end: '...ACGT>c2' in one line, whose length is not its
    record's, was refused as "inconsistent line lengths", which a re-wrap cannot mend. The line is the first
    file's last (the oracle: its line count)."""
    a = write_fasta(tmp_path / "a.fa", {"c1": random_genome(1, 240 + last, n_runs=0)}).read_bytes()[:-1]
    b = write_fasta(tmp_path / "b.fa", {"c2": random_genome(2, 150), "c3": random_genome(3, 90)}).read_bytes()
    path = tmp_path / ("ab.fa" if kind == "plain" else "ab.fa.gz")
    _write(path, a + b, kind)
    out, line = tmp_path / "out", len(a.splitlines())
    with pytest.raises(LcftError, match=rf"ab\.fa(\.gz)?: line {line} holds a '>' inside a sequence "
                                        r"line: a header joined to the sequence before it, .*\(`cat a\.fa b\.fa`\)"):
        prepare_windows(fasta=str(path), out=str(out), length=64, train=("c1",), eval=())
    assert not out.exists()


def _small_bpe(tmp_path) -> str:
    """A BPE of 64 tokens trained with `tokenizers` on random bases: a model tokenizer's path through prepare."""
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    seq = random_genome(9, 20_000, softmask=False, n_runs=0)
    tk.train_from_iterator((seq[i : i + 500] for i in range(0, len(seq), 500)),
                           trainers.BpeTrainer(vocab_size=64, special_tokens=["<pad>", "<unk>"], show_progress=False))
    tk.save(str(tmp_path / "bpe.json"))
    return str(tmp_path / "bpe.json")


@pytest.mark.parametrize("kind", ["plain", "bgzf"])
def test_a_joined_header_making_a_full_line_is_refused_where_its_bases_are_read(tmp_path, kind):
    """`cat a.fa b.fa`, a.fa's last line 55 bases and no line end, b.fa's first record one line: '...>chr2' is a
    full 60-byte line, so the index fits and chr2's line reads as chr1's last: chr1 had '>chr2' among its bases (as
    N) and chr2 vanished. Biopython (the oracle) reads '>' inside chr1 the same way; every read of chr1's bases
    (inspect; prepare with char, k-mer and BPE tokens) now refuses it naming the record and base."""
    last = 60 - len(">chr2")  # the joined line: exactly a full line
    a = write_fasta(tmp_path / "a.fa", {"chr1": random_genome(1, 240 + last, n_runs=0)}).read_bytes()[:-1]
    b = write_fasta(tmp_path / "b.fa", {"chr2": random_genome(2, 50, n_runs=0),
                                        "chr3": random_genome(3, 150, n_runs=0)}).read_bytes()
    assert [len(line) for line in (a + b).splitlines()] == [5, 60, 60, 60, 60, 60, 50, 5, 60, 60, 30]
    path = tmp_path / ("ab.fa" if kind == "plain" else "ab.fa.gz")
    _write(path, a + b, kind)
    bio = bio_records(path)  # (a BGZF is a gzip to it)
    assert list(bio) == ["chr1", "chr3"] and bio["chr1"].index(">") == 240 + last and len(bio["chr1"]) == 350
    with FastaFile(path) as fasta:  # the layout fits: opened, as Biopython reads it
        assert {n: fasta.length(n) for n in fasta.names} == {"chr1": 350, "chr3": 150}
    refusal = (rf"ab\.fa(\.gz)?: record 'chr1' \(at base {240 + last + 1}\) holds a '>' inside a sequence line: a "
               r"header joined to the sequence before it, .*\(`cat a\.fa b\.fa`\); break the line before its '>'")
    with pytest.raises(LcftError, match=refusal):
        inspect_fasta(path)
    for tok in ("char", "kmer:3", _small_bpe(tmp_path)):
        out = tmp_path / f"out{len(tok)}"
        with pytest.raises(LcftError, match=refusal):
            prepare_windows(fasta=str(path), out=str(out), length=16, train=("chr1",), eval=(), tokenizer=tok,
                            max_n_frac=1.0, max_oov_frac=1.0)
        assert not out.exists()


@pytest.mark.parametrize("kind", ["plain", "gzip", "bgzf", "crlf"])
def test_a_record_asked_for_whose_header_is_joined_to_the_line_before_is_named(tmp_path, kind):
    """The layout above (the index fits; chr2's header inside chr1's last line) with chr2 asked for by name: the
    refusal had said only that chr2 is not there (and guessed chr3); it names the line holding '>chr2' and the
    mend, as the refusal of its bases does. The line is the one holding '>chr2' after its start (the oracle), in
    the file as given: also where a blank line before it (CRLF line ends) has it indexed from a normalized copy.
    A BGZF, indexed in place, is not inflated to look for it."""
    a = write_fasta(tmp_path / "a.fa", {"chr1": random_genome(1, 295, n_runs=0)}).read_bytes()[:-1]
    b = write_fasta(tmp_path / "b.fa", {"chr2": random_genome(2, 50, n_runs=0),
                                        "chr3": random_genome(3, 150, n_runs=0)}).read_bytes()
    data = (a + b).replace(b"\n", b"\r\n").replace(b">chr1\r\n", b">chr1\r\n\r\n") if kind == "crlf" else a + b
    line = next(k for k, text in enumerate(data.split(b"\n"), 1) if b">chr2" in text[1:])
    assert line == (7 if kind == "crlf" else 6)
    path = tmp_path / ("ab.fa" if kind in ("plain", "crlf") else "ab.fa.gz")
    _write(path, data, kind)
    # (--train, --eval) and the names refused: no guess for chr2 (chr3 had been guessed), one for a mistyped name
    for train, held_out, named in ((("chr2",), (), "chr2"), (("chr3",), ("chrX", "chr2"),
                                                               r"chrX \(did you mean 'chr3'\?\), chr2")):
        out = tmp_path / f"out{len(held_out)}"
        if kind == "bgzf":  # not inflated for a message (a genome's takes a minute): not found, as before
            with pytest.raises(LcftError, match=r"^chromosome .*chr2.* not found in .*ab\.fa\.gz; available: chr1, chr3$"):
                prepare_windows(fasta=str(path), out=str(out), length=16, train=train, eval=held_out)
            continue
        with pytest.raises(LcftError, match=rf"^chromosome {named} not found in .*ab\.fa(\.gz)?; available: chr1, "
                                            rf"chr3; line {line} holds '>chr2' inside a sequence line: a header joined "
                                            r"to the sequence before it, .*\(`cat a\.fa b\.fa`\); break the line "
                                            r"before its '>'"):
            prepare_windows(fasta=str(path), out=str(out), length=16, train=train, eval=held_out)
        assert not out.exists()


def test_glued_headers_across_blocks(tmp_path):
    """Read in blocks of 1 to 8 bytes, so a header is cut between blocks: the line of each name's first header
    inside a sequence line (not a header line; its name ended by a blank, a line end or the file's end), as each
    line read on its own gives (the oracle: lines split at LF, then at CR), or none."""
    texts = [">a\nACGT>b\nAC\n", ">a x>b\nACGT\n", ">a\nAC>bb\n>b\nAC", ">a\nACGT\nAC>b", ">a\rAC>b\rAC\r",
             ">a\r\nAC>b c\r\n", ">a\nAC>c\nAC>b\nAC>c\n", ">a\nAC>b\x1cx\n", ">b\nAC\n>a\nAC>b\n", "ACGT>b\n",
             ">a\nACGT>b\n>c\nAC>c d>b\n"]
    names = ["b", "c", "z"]
    for k, text in enumerate(texts):
        data = text.encode()
        path = tmp_path / f"t{k}.fa"
        path.write_bytes(data)
        want = {}
        for n, line in enumerate(data.split(b"\n"), 1):
            for piece in line.split(b"\r"):
                for name in names:
                    glued = re.search(rb">" + name.encode() + rb"(?=[\s\x1c-\x1f]|$)", piece)
                    if glued and not piece.startswith(b">"):
                        want.setdefault(name, n)
        assert want or k in (1, 2), text  # the texts hold joined headers but for those two
        for block in range(1, 9):
            assert glued_headers(path, names, block=block) == want, (text, block)
        assert glued_headers(path, names) == want and glued_headers(path, []) == {}


def test_odd_sequence_line_across_blocks(tmp_path):
    """Read in blocks of 5 bytes: the first line not a header holding a '>' or a byte above 127, as each line read
    on its own gives (the oracle), or None; a '>' or 'é' in a header is not one."""
    texts = [">a>b é\nACGT\nAC>c\nAC\n", ">a\nACGT\n>b\nACGT\nAé\n", ">a\nAC\nACGTACGT>b\n", ">a x>y\nACGT\n>b\nAC\n"]
    for k, text in enumerate(texts):
        data = text.encode()
        path = tmp_path / f"t{k}.fa"
        path.write_bytes(data)
        want = next(((n, m[0:1]) for n, line in enumerate(data.split(b"\n"), 1) if not line.startswith(b">")
                     for m in [bytes(c for c in line if c > 127 or c == ord(">"))] if m), None)
        assert odd_sequence_line(path, block=5) == want, text


def test_a_record_name_cut_at_its_comma_is_refused_saying_how_to_give_it(tmp_path):
    """--train 'c1,x' reaches prepare as c1 and x (the flag splits at commas): the refusal said only that neither is
    there; it says a TOML list takes the name as given, and that list (one name, not split) prepares it."""
    path = write_fasta(tmp_path / "c.fa", {"c1,x": random_genome(1, 128, n_runs=0), "c2": random_genome(2, 64)})
    with pytest.raises(LcftError, match=r"chromosome c1 \(did you mean 'c1,x'\?\), x not found in .*c\.fa; available: "
                                        r"c1,x, c2; record 'c1,x' holds a comma, at which --train and --eval split "
                                        r'their names: give it in a --config TOML list, e\.g\. train = \["c1,x"\]$'):
        prepare_windows(fasta=str(path), out=str(tmp_path / "o1"), length=64, train=("c1", "x"), eval=())
    with pytest.raises(LcftError, match=r"chromosome c3 not found in .*; available: c1,x, c2$"):  # no comma in play
        prepare_windows(fasta=str(path), out=str(tmp_path / "o2"), length=64, train=("c3",), eval=())
    m = prepare_windows(fasta=str(path), out=str(tmp_path / "o3"), length=64, train=("c1,x",), eval=())
    assert m["splits"]["train"]["windows"] == 2
