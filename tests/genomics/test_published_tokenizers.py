"""Tokenizer files as published (METAGENE-1's tokenizer.json and roles, GENERator's `TOKEN ID` 6-mer vocab.txt and
roles, DNABERT's one-token-a-line vocab.txt): window ids against each tokenizer's own algorithm on real sequence
with an N run and soft-masked bases, the exported AutoTokenizer's special tokens, bad vocab.txt lines."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from lcft.errors import LcftError
from lcft.genomics import open_windows, prepare_windows
from lcft.genomics.hf_tokenizer import export_tokenizer, save_hf_tokenizer
from lcft.genomics.model_tokenizer import load_tokenizer
from lcft.model.config import COUNT_LIMITS
from tests.conftest import SHARED_PUBLISHED as PUBLISHED
from tests.genomics.conftest import bio_records

transformers = pytest.importorskip("transformers")
CHR22 = ("grch37_chr22_20000001-21000000.fa", "22:20000001-21000000")  # holds a 100 kb N run
CHR2 = ("hg38_chr2_1-2333275.fa.gz", "chr2")  # soft-masked, an N telomere
ROLES = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token", "sep_token", "cls_token")
# GENERator's vocabulary as its tokenizer builds it: its special tokens, then every 6-mer over "ATCG" in
# itertools.product order; current revisions write it as one `TOKEN ID` pair a line
GEN_SPECIALS = ["<oov>", "<s>", "</s>", "<pad>", "<mask>", "<bog>", "<eog>", "<bok>", "<eok>", "<+>", "<->",
                "<cds>", "<pseudo>", "<tRNA>", "<rRNA>", "<ncRNA>", "<miscRNA>", "<mam>", "<vrt>", "<inv>", "<pln>",
                "<fng>", "<prt>", "<arc>", "<bct>", "<mit>", "<plt>", "<plm>", "<vir>", "<sp0>", "<sp1>", "<sp2>"]
GEN_VOCAB = GEN_SPECIALS + ["".join(p) for p in itertools.product("ATCG", repeat=6)]


@pytest.fixture(autouse=True)
def _published():
    if not PUBLISHED.is_dir():
        pytest.skip(f"published model files not found at {PUBLISHED}")


def generator_folder(path: Path, vocab: list[str] = GEN_VOCAB) -> Path:
    """A GENERator tokenizer folder: `TOKEN ID` vocab.txt and the published special_tokens_map.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("".join(f"{t} {i}\n" for i, t in enumerate(vocab)))
    shutil.copy(PUBLISHED / "generator-eukaryote-3b-base" / "special_tokens_map.json", path)
    return path


def generator_rule(seq: str) -> tuple[list[int], list[int]]:
    """GENERator's tokenizer, written here from its description: over the upper-case text, left to right, six
    letters at a time (N is a letter like any other), the last < 6 letters as one token; a token missing from
    the vocabulary is <oov>."""
    index = {t: i for i, t in enumerate(GEN_VOCAB)}
    toks = re.findall(r"[A-Z]{6}|[A-Z]+", seq.upper())
    return [index.get(t, index["<oov>"]) for t in toks], [len(t) for t in toks]


def documented_bpe(tk: Tokenizer, seq: str) -> tuple[list[int], list[int]]:
    """METAGENE-1's tokenizer on lcft's documented pieces: runs of A/C/G/T or of other letters, cut every 4096."""
    up, ids, counts = seq.upper(), [], []
    for b in range(0, len(up), 4096):
        for m in re.finditer("[ACGT]+|[^ACGT]+", up[b : b + 4096]):
            enc = tk.encode(m.group(), add_special_tokens=False)
            ids += enc.ids
            counts += [e - s for s, e in enc.offsets]
    return ids, counts


def check_windows(out: Path, seq: str, ids: list[int], counts: list[int], length: int) -> int:
    """Every window's ids and base span equal the oracle's token stream over the whole record."""
    first = np.concatenate(([0], np.cumsum(counts)))  # (n_tok+1,) base offset of each token
    ws = open_windows(out, "train")
    for i in range(len(ws)):
        _, s, e = ws.coords(i)
        g = int(np.searchsorted(first, s))
        assert first[g] == s and first[g + length] == e
        assert ws[i].tolist() == ids[g : g + length]
    return len(ws)


@pytest.mark.parametrize("genome", [CHR22, CHR2])
def test_generator_token_id_vocab_windows_follow_its_rule(genome, genomes_dir, tmp_path):
    """N inside 6-mers, frames from the record's start, the record's tail as one token: ids equal GENERator's."""
    name, chrom = genome
    seq = bio_records(genomes_dir / name)[chrom]
    folder = generator_folder(tmp_path / "gen")
    out = tmp_path / "out"
    prepare_windows(fasta=str(genomes_dir / name), out=str(out), length=1024, stride=4096, train=(chrom,), eval=(),
                    max_n_frac=1.0, max_oov_frac=1.0, tokenizer=str(folder))
    ids, counts = generator_rule(seq)
    assert check_windows(out, seq, ids, counts, 1024) > 20
    tok = open_windows(out, "train").tokenizer
    assert tok.vocab == GEN_VOCAB and tok.vocab[tok.unk_id] == "<oov>"
    assert load_tokenizer(f"kmer:6:{folder / 'vocab.txt'}").sha256() == tok.sha256()  # both ways of naming it


@pytest.mark.parametrize("genome", [CHR22, CHR2])
def test_metagene_windows_equal_its_published_tokenizer(genome, genomes_dir, tmp_path):
    name, chrom = genome
    seq = bio_records(genomes_dir / name)[chrom]
    out = tmp_path / "out"
    prepare_windows(fasta=str(genomes_dir / name), out=str(out), length=1024, stride=8192, train=(chrom,), eval=(),
                    max_n_frac=1.0, max_oov_frac=1.0, tokenizer=str(PUBLISHED / "metagene-1"))
    ids, counts = documented_bpe(Tokenizer.from_file(str(PUBLISHED / "metagene-1" / "tokenizer.json")), seq)
    assert check_windows(out, seq, ids, counts, 1024) > 20


@pytest.mark.parametrize("model", ["metagene-1", "generator-eukaryote-3b-base"])
def test_export_has_the_published_special_tokens(model, tmp_path):
    """Roles read from special_tokens_map.json / tokenizer_config.json, kept through prepared data and a
    checkpoint, and exported: AutoTokenizer's special tokens and ids are the published ones."""
    from lcft.genomics import sample_fasta

    src = PUBLISHED / model if model == "metagene-1" else generator_folder(tmp_path / "gen")
    published = json.loads((PUBLISHED / model / "special_tokens_map.json").read_text())
    out = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=512, train="chr2", eval=(), max_n_frac=1.0,
                    max_oov_frac=1.0, tokenizer=str(src))
    tok = open_windows(out, "train").tokenizer
    assert tok.roles == published
    save_hf_tokenizer(tok, tmp_path / "ckpt")  # what a checkpoint carries
    export_tokenizer(tmp_path / "ckpt", tmp_path / "export")
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    index = {t: i for i, t in enumerate(tok.vocab)}
    for role in ROLES:
        assert getattr(auto, role) == published.get(role), role
        if role in published:
            assert getattr(auto, f"{role}_id") == index[published[role]], role
    assert len(auto) == len(tok.vocab)  # no special token was added under a new id


def test_dnabert_one_token_a_line_vocab():
    tok = load_tokenizer(f"kmer:6:{PUBLISHED / 'dnabert-6'}")
    lines = (PUBLISHED / "dnabert-6" / "vocab.txt").read_text().splitlines()
    assert tok.vocab == lines and len(lines) == 4101
    assert tok.roles == json.loads((PUBLISHED / "dnabert-6" / "special_tokens_map.json").read_text())
    seq = "ACGTACGGATTACANNNNNNACGTTT"
    ids, counts = tok.encode_chunk(np.frombuffer(seq.encode(), np.uint8), np.array([0, len(seq)]))
    assert ids.tolist() == [lines.index(seq[i : i + 6]) if seq[i : i + 6] in lines else lines.index("[UNK]")
                            for i in range(0, 24, 6)] + [lines.index("[UNK]")]
    assert counts.tolist() == [6, 6, 6, 6, 2]


@pytest.mark.parametrize(("lines", "match"), [
    (["<oov> 0", "A 1", "C 2", "G 3", "T 4", "C 5"], "line 6 repeats token 'C' of line 3"),
    (["<oov> 0", "A 1", "C 2", "G 3", "T 2"], "line 5 repeats id 2 of line 3"),
    (["<oov> 0", "A 1", "C", "G 3", "T 4"], "line 3 .*mixed layouts"),
    (["<oov>", "A", "C 5", "G", "T"], "line 3 .*mixed layouts"),
    (["<oov>", "A", "", "G", "T"], "line 3 is empty"),
    # ids a model can have (COUNT_LIMITS): one past them is refused naming its line (it was prepared, for train to
    # refuse); the last of them among 6 tokens would make a 4M-row embedding over half empty (prepared in 69 s)
    (["<oov> 0", "A 1", "C 2", "G 3", f"T {COUNT_LIMITS['vocab_size']}"], "line 5: id 4194304 .*limit"),
    ([f"<oov> {COUNT_LIMITS['vocab_size'] - 1}", "A 1", "C 2", "G 3", "T 4", "N 5"],
     "its ids run to 4,194,303 for 6 tokens"),
])
def test_bad_vocab_txt_names_the_line(lines, match, tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(LcftError, match=match):
        load_tokenizer(f"kmer:1:{tmp_path / 'vocab.txt'}")


def test_vocab_txt_with_a_byte_order_mark_is_named(tmp_path):
    """DNABERT-6's folder with its vocab.txt saved with a UTF-8 BOM: the mark is named, not a [PAD] said missing."""
    folder = shutil.copytree(PUBLISHED / "dnabert-6", tmp_path / "dnabert-6")
    (folder / "vocab.txt").write_bytes(b"\xef\xbb\xbf" + (PUBLISHED / "dnabert-6" / "vocab.txt").read_bytes())
    for name in (str(folder), f"kmer:6:{folder / 'vocab.txt'}"):
        with pytest.raises(LcftError, match="vocab.txt starts with a UTF-8 byte-order mark"):
            load_tokenizer(name)


def test_token_id_layout_is_not_mistaken_for_missing_bases(tmp_path):
    """The old reading took `AAAAAA 32` as a token and reported no token for A, C, G, T."""
    folder = generator_folder(tmp_path / "gen")
    assert load_tokenizer(f"kmer:6:{folder / 'vocab.txt'}").vocab_size == 4128


def test_content_check_refuses_two_ids_swapped(tmp_path):
    """Data cut with one vocabulary, a model folder with the same size but two ids swapped: refused."""
    from lcft.checkpoint.layout import check_tokenizer
    from lcft.genomics import sample_fasta

    m = prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "data"), length=512, train="chr2", eval=(),
                        max_n_frac=1.0, max_oov_frac=1.0, tokenizer=str(generator_folder(tmp_path / "a")))
    swapped = list(GEN_VOCAB)
    swapped[40], swapped[41] = swapped[41], swapped[40]
    for name, vocab in (("same", GEN_VOCAB), ("swapped", swapped)):
        generator_folder(tmp_path / name, vocab)
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": len(vocab)}))
    check_tokenizer(tmp_path / "same", m["tokenizer"])
    with pytest.raises(LcftError, match="different tokenizer"):
        check_tokenizer(tmp_path / "swapped", m["tokenizer"])
    (tmp_path / "bare").mkdir()  # a model folder without tokenizer files: the size alone proves nothing
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"vocab_size": len(GEN_VOCAB)}))
    with pytest.raises(LcftError, match="holds no tokenizer"):
        check_tokenizer(tmp_path / "bare", m["tokenizer"])


def bomb(tmp_path: Path, vocab: dict, pattern: str = "(?m:.)") -> Path:
    """A small WordLevel tokenizer.json (the probe's 388-byte shape)."""
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            "post_processor": None, "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("big", [10**9, 2**32 - 1])
def test_huge_id_is_refused_before_allocation(big, tmp_path):
    path = bomb(tmp_path, {"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": big})
    assert path.stat().st_size < 400
    with pytest.raises(LcftError, match=rf"model.vocab token 'T': id {big} .*0 to 4194303 \(the id limit\)"):
        load_tokenizer(str(path))
    with pytest.raises(LcftError, match="id limit"):
        load_tokenizer(f"kmer:1:{path}")


def test_catastrophic_regex_is_one_line(tmp_path):
    """A split regex the engine gives up on (a Rust panic inside tokenizers) is refused at load, in one line,
    through the CLI too."""
    from typer.testing import CliRunner

    from lcft.cli.app import app
    from lcft.genomics import sample_fasta

    path = bomb(tmp_path, {"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": 4}, "(A|AA)+C")
    with pytest.raises(LcftError, match=r"regex engine gives up on pre_tokenizer.pattern '\(A\|AA\)\+C'"):
        load_tokenizer(str(path))
    r = CliRunner().invoke(app, ["prepare", "windows", "--fasta", str(sample_fasta()), "--out", str(tmp_path / "o"),
                                 "--train", "chr2", "--eval", "chr22", "--tokenizer", str(path)])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "regex engine gives up" in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def _dnabert_lines(folder: Path) -> list[str]:
    return (folder / "vocab.txt").read_text().splitlines()


@pytest.mark.parametrize(("damage", "named"), [
    ("drop AAAAAA", "no token for AAAAAA of the 4,096 A/C/G/T 6-mers"),
    ("lower-case AAAAAC", "no token for AAAAAC of the 4,096"),
    ("cut at line 500", "and 3,600 more of the 4,096 A/C/G/T 6-mers"),
    ("k 5 in tokenizer_config.json", "no token for AAAAA and 1,023 more of the 1,024 A/C/G/T 5-mers"),
])
def test_a_damaged_dnabert_vocabulary_is_refused_naming_a_missing_kmer(damage, named, tmp_path):
    """DNABERT-6's folder with a 6-mer gone from its vocab.txt (or K not its K): prepare cut with it anyway, every
    such 6-mer an unknown token without loss (or refused all windows blaming the letter N)."""
    from lcft.genomics import sample_fasta

    folder = tmp_path / "dnabert-6"
    shutil.copytree(PUBLISHED / "dnabert-6", folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    lines = _dnabert_lines(folder)
    if damage == "k 5 in tokenizer_config.json":
        (folder / "tokenizer_config.json").write_text(json.dumps({"k": 5}))
    else:
        lines = {"drop AAAAAA": [t for t in lines if t != "AAAAAA"], "cut at line 500": lines[:500],
                 "lower-case AAAAAC": [t.lower() if t == "AAAAAC" else t for t in lines]}[damage]
        (folder / "vocab.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(LcftError, match=re.escape(named)) as e:
        prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "out"), length=1024, train=("chr2",),
                        eval=("chr22",), tokenizer=str(folder))
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
