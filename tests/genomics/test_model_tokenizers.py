"""prepare with the model's own tokenizer (BPE trained here with `tokenizers`, a 6-mer vocabulary, char) on the real
samples, against `tokenizers` run on the documented pieces and Biopython's sequence at every window's span."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from lcft.genomics import open_windows, prepare_windows, verify_windows
from lcft.genomics.dataset import IGNORE_INDEX, DataConfig, TrainSamples
from tests.conftest import SHARED_GENOMES
from tests.genomics.conftest import bio_records

L = 8192
BLOCK = 4096  # the documented BPE piece rule: runs of A/C/G/T or of other letters, cut at multiples of 4096
GENOMES = {
    "hg38_chr2": ("hg38_chr2_1-2333275.fa.gz", "chr2", L),
    "chr22_N_run": ("grch37_chr22_20000001-21000000.fa", "22:20000001-21000000", L // 2 + 8),
}


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
    """A BPE vocabulary of 512 trained with `tokenizers` on the hg38 piece (upper case, 1 kb sentences)."""
    if not SHARED_GENOMES.is_dir():
        pytest.skip(f"shared genome samples not found at {SHARED_GENOMES}")
    seq = records(SHARED_GENOMES / "hg38_chr2_1-2333275.fa.gz")["chr2"].upper()
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.train_from_iterator((seq[i : i + 1000] for i in range(0, len(seq), 1000)),
                           trainers.BpeTrainer(vocab_size=512, special_tokens=["<pad>", "<unk>"], show_progress=False))
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tk.save(str(path))
    return path


@pytest.fixture(scope="module")
def kmer_vocab(tmp_path_factory):
    """A 6-mer vocab.txt in an order of its own (ids come from the file): specials, K-mers shuffled, letters."""
    import itertools

    kmers = ["".join(p) for p in itertools.product("ACGT", repeat=6)]
    np.random.default_rng(0).shuffle(kmers)
    vocab = ["[PAD]", "[UNK]", *kmers, "NNNNNN", *"ACGTN"]
    path = tmp_path_factory.mktemp("kmer") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    return path, vocab


@functools.cache
def records(path: Path) -> dict[str, str]:
    """bio_records of a shared sample, read once for the module (its tests only read the sequences)."""
    return bio_records(path)


@functools.cache
def hg38_bpe_tokens(bpe_file: Path) -> tuple[list[int], np.ndarray]:
    """oracle_tokens of the hg38 piece under `bpe_file`, for the two tests that compare with it (neither changes it)."""
    return oracle_tokens("bpe", records(SHARED_GENOMES / "hg38_chr2_1-2333275.fa.gz")["chr2"], bpe_file, None)


def oracle_tokens(kind: str, seq: str, bpe_file, kmer_vocab) -> tuple[list[int], np.ndarray]:
    """Token ids and bases per token of a whole record, straight from `tokenizers` (offsets give the bases)."""
    up = seq.upper()
    if kind == "char":
        return [], np.ones(len(up), np.int64)
    if kind == "bpe":
        tk = Tokenizer.from_file(str(bpe_file))
        pieces = [m.group() for b in range(0, len(up), BLOCK) for m in re.finditer("[ACGT]+|[^ACGT]+", up[b : b + BLOCK])]
    else:  # non-overlapping 6-mers from the record's start, N inside them; single letters for the last < 6
        _, vocab = kmer_vocab
        tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tk.pre_tokenizer = pre_tokenizers.Split(Regex(".{6}|."), behavior="isolated")
        pieces = [up]
    ids, counts = [], []
    for p in pieces:
        enc = tk.encode(p, add_special_tokens=False)
        ids += enc.ids
        counts += [e - s for s, e in enc.offsets]
        assert sum(e - s for s, e in enc.offsets) == len(p)
    return ids, np.array(counts, np.int64)


def spec_of(kind: str, bpe_file, kmer_vocab) -> str:
    return {"char": "char", "bpe": str(bpe_file), "kmer": f"kmer:6:{kmer_vocab[0]}"}[kind]


@pytest.mark.parametrize("genome", list(GENOMES))
@pytest.mark.parametrize("kind", ["bpe", "kmer", "char"])
def test_windows_match_tokenizers_and_biopython(kind, genome, genomes_dir, tmp_path, bpe_file, kmer_vocab):
    name, chrom, stride = GENOMES[genome]
    seq = records(genomes_dir / name)[chrom]
    out = tmp_path / "out"
    m = prepare_windows(fasta=str(genomes_dir / name), out=str(out), length=L, stride=stride, train=(chrom,),
                        eval=(), tokenizer=spec_of(kind, bpe_file, kmer_vocab))
    ids, counts = hg38_bpe_tokens(bpe_file) if (kind, genome) == ("bpe", "hg38_chr2") else \
        oracle_tokens(kind, seq, bpe_file, kmer_vocab)
    first = np.concatenate(([0], np.cumsum(counts)))  # (n_tok+1,) base offset of each token
    non_acgt = np.concatenate(([0], np.cumsum(~np.isin(np.frombuffer(seq.upper().encode(), np.uint8),
                                                          np.frombuffer(b"ACGT", np.uint8)))))
    lower = np.concatenate(([0], np.cumsum(np.frombuffer(seq.encode(), np.uint8) >= ord("a"))))
    kept = []
    for g in range(0, len(counts) - L + 1, stride):
        s, e = first[g], first[g + L]
        if (non_acgt[e] - non_acgt[s]) / (e - s) <= 0.1:
            kept.append(g)
    ws = open_windows(out, "train")
    assert len(ws) == len(kept) > 0 and m["splits"]["train"]["windows"] == len(kept)
    assert ws.dtype == np.dtype("uint8" if kind == "char" else "uint16") and m["ids_dtype"] == ws.dtype.name
    tk = None if kind == "char" else Tokenizer.from_str((out / "tokenizer.json").read_text())
    for i, g in enumerate(kept):
        c, s, e = ws.coords(i)
        assert (c, s, e) == (chrom, first[g], first[g + L])
        if kind != "char":
            assert ws[i].tolist() == ids[g : g + L]
            assert tk.decode(ws[i].tolist()).replace(" ", "") == seq[s:e].upper()  # the tokenizer's own decode
        assert ws.sequence(i) == seq[s:e]  # case kept: lower case where soft-masked
        assert np.array_equal(ws.base_offsets(i), first[g : g + L] - s)
        low = lower[first[g + 1 : g + L + 1]] - lower[first[g : g + L]]  # (L,) lower-case bases per token
        assert np.array_equal(ws.softmask(i), 2 * low >= counts[g : g + L])  # at least half the bases
    assert m["splits"]["train"]["bases"] == sum(ws.coords(i)[2] - ws.coords(i)[1] for i in range(len(ws)))
    assert m["splits"]["train"]["oov"] == 0
    verify_windows(out)


@pytest.mark.parametrize("kind", ["bpe", "kmer"])
def test_tokens_with_n_carry_no_loss(kind, genomes_dir, tmp_path, bpe_file, kmer_vocab):
    """chr22's 100 kb N run: tokens of N bases are never a label; every A/C/G/T-only token is."""
    name, chrom, _ = GENOMES["chr22_N_run"]
    out = tmp_path / "out"
    prepare_windows(fasta=str(genomes_dir / name), out=str(out), length=L, train=(chrom,), eval=(), max_n_frac=1.0,
                    tokenizer=spec_of(kind, bpe_file, kmer_vocab))
    ws = open_windows(out, "train")
    samples = TrainSamples(ws, DataConfig(seq_len=L))
    with_n = 0
    for w in range(len(ws)):
        labels = samples.example(w)["labels"]
        spelled = [ws.tokenizer.bases()[t] for t in ws[w].tolist()]
        want = [all(ch in "ACGT" for ch in b) and b != "" for b in spelled[1:]]
        assert ((labels[:-1] != IGNORE_INDEX) == np.array(want)).all() and labels[-1] == IGNORE_INDEX
        with_n += sum("N" in b for b in spelled)
    assert with_n > 0


def test_bpe_chunking_costs_under_a_tenth_of_a_percent(genomes_dir, bpe_file):
    """The documented 4096-base pieces against tokenizing the whole 2.3 Mbp record at once."""
    seq = records(genomes_dir / "hg38_chr2_1-2333275.fa.gz")["chr2"]
    whole = len(Tokenizer.from_file(str(bpe_file)).encode(seq.upper(), add_special_tokens=False).ids)
    pieces = len(hg38_bpe_tokens(bpe_file)[0])
    assert whole <= pieces <= whole * 1.001


def test_char_manifest_and_files_unchanged(tmp_path):
    """char keeps uint8 ids, no side files, no tokenizer.json, the char spec."""
    from lcft.genomics import sample_fasta
    from lcft.genomics.tokenizer import tokenizer_spec

    out = tmp_path / "c"
    m = prepare_windows(fasta=str(sample_fasta()), out=str(out), length="64K", train="chr2", eval="chr22")
    assert m["tokenizer"] == tokenizer_spec() and m["ids_dtype"] == "uint8" and m["files"] == {}
    assert sorted(p.name for p in out.iterdir()) == ["eval.bin", "eval.softmask.bin", "manifest.json",
                                                      "prepare.toml", "train.bin", "train.softmask.bin"]


def test_the_tokenizer_json_of_a_char_export_reads_as_char(genomes_dir, tmp_path):
    """The tokenizer.json lcft exports for its char vocabulary, given to prepare (a char model's export, as eval
    advises): char's spec and files byte for byte (it was read as a 9-token kmer:1, ambiguity codes as <unk>, which
    the model refused), the ids `tokenizers` and transformers give for each record from that file (the oracle), on
    the hg38 piece (soft-masked bases, the N telomere's end) and a record of ambiguity codes and other letters."""
    from lcft.genomics.hf_tokenizer import save_hf_tokenizer
    from lcft.genomics.model_tokenizer import load_tokenizer
    from tests.genomics.conftest import write_fasta

    transformers = pytest.importorskip("transformers")
    seq = records(genomes_dir / "hg38_chr2_1-2333275.fa.gz")["chr2"]
    recs = {"telomere_end": seq[6000:14000], "masked": seq[700_000:708_000], "iupac": "ACGTRYKMacgtnnSWUuXxacgt" * 50}
    fasta, export = write_fasta(tmp_path / "r.fa", recs), tmp_path / "export"
    save_hf_tokenizer(load_tokenizer("char"), export)
    out = {spec: tmp_path / f"out-{i}" for i, spec in enumerate(("char", str(export)))}
    for spec, folder in out.items():
        prepare_windows(fasta=str(fasta), out=str(folder), length=64, train=tuple(recs), eval=(), max_n_frac=1.0,
                        max_oov_frac=1.0, tokenizer=spec)
    names = sorted(p.name for p in out["char"].iterdir())
    assert sorted(p.name for p in out[str(export)].iterdir()) == names  # no tokenizer.json, no per-base files
    for name in set(names) - {"prepare.toml"}:  # (which records --out and --tokenizer as given)
        assert (out[str(export)] / name).read_bytes() == (out["char"] / name).read_bytes(), name
    ws = open_windows(out[str(export)], "train")
    tk, auto = Tokenizer.from_file(str(export / "tokenizer.json")), transformers.AutoTokenizer.from_pretrained(str(export))
    for name, rec in recs.items():
        want = [t for i in range(len(ws)) if ws.coords(i)[0] == name for t in ws[i].tolist()]
        assert len(want) == len(rec) // 64 * 64, name  # every window kept: each base checked
        assert tk.encode(rec, add_special_tokens=False).ids[: len(want)] == want, name
        assert auto(rec, add_special_tokens=False)["input_ids"][: len(want)] == want, name
    assert sorted({int(t) for i in range(len(ws)) if ws.coords(i)[0] == "iupac" for t in ws[i]}) == [3, 4, 5, 6, 7, 8]


def test_rerun_with_another_tokenizer_is_refused(tmp_path, bpe_file):
    from lcft.errors import LcftError
    from lcft.genomics import sample_fasta

    kw = {"fasta": str(sample_fasta()), "out": str(tmp_path / "o"), "length": L, "train": "chr2", "eval": ()}
    m = prepare_windows(**kw, tokenizer="kmer:6")
    assert prepare_windows(**kw, tokenizer="kmer:6") == m  # same options: nothing to do
    with pytest.raises(LcftError, match="different tokenizer .*was kmer:6, now bpe"):
        prepare_windows(**kw, tokenizer=str(bpe_file))


def random_bases(n: int, seed: int) -> str:
    """`n` random A/C/G/T bases."""
    return "".join(np.random.default_rng(seed).choice(list("ACGT"), n))


def _marked_bpe(path, replacement: str = "", **marks) -> str:
    """A small BPE trained here on random bases, cut into words of up to 7 bases so its tokens carry `marks`
    (continuing_subword_prefix on a word's inner pieces, end_of_word_suffix on its last), or a Metaspace's
    `replacement` before each piece's first word."""
    seqs = [random_bases(500, seed) for seed in range(60)]
    tk = Tokenizer(models.BPE(unk_token="<unk>", **marks))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(".{1,7}"), behavior="isolated")
    if replacement:
        mark = pre_tokenizers.Metaspace(replacement, prepend_scheme="first")
        tk.pre_tokenizer = pre_tokenizers.Sequence([tk.pre_tokenizer, mark])
    tk.train_from_iterator(seqs, trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<unk>"],
                                                     show_progress=False, **marks))
    tk.save(str(path))
    return str(path)


@pytest.mark.parametrize("marks", [{"continuing_subword_prefix": "@@"}, {"end_of_word_suffix": "</w>"},
                                   {"replacement": "_"}], ids=["inner-prefix", "final-suffix", "word-start"])
def test_marked_bpe_tokens_spell_their_bases_and_carry_loss(marks, tmp_path):
    """A BPE whose tokens carry a word-piece or word-start mark of its own: ids as `tokenizers` gives them for each piece, bases
    per token as its offsets say, and every token of A/C/G/T bases carries loss (is counted)."""
    from lcft.genomics.model_tokenizer import load_tokenizer
    from lcft.genomics.seq_tokenizer import UPPER

    tok = load_tokenizer(_marked_bpe(tmp_path / "tokenizer.json", **marks))
    tk = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    seq = random_bases(300, 99)
    seq = seq[:100] + seq[100:180].lower() + "NNNNRY" + seq[180:]
    raw = np.frombuffer(seq.encode(), np.uint8)
    ids, counts = tok.encode_chunk(UPPER[raw], tok.pieces(raw, 0))
    want_ids, want_counts, bases = [], [], []
    for m in re.finditer("[ACGT]+|[^ACGT]+", seq.upper()):
        enc = tk.encode(m.group(), add_special_tokens=False)
        want_ids += enc.ids
        # a lone word-start mark shares its span with the token after it, which holds the bases
        spans = [(s, s if s == o[0] else e) for (s, e), o in zip(enc.offsets, [*enc.offsets[1:], (-1, -1)], strict=True)]
        want_counts += [e - s for s, e in spans]
        bases += [m.group()[s:e] for s, e in spans]
    assert ids.tolist() == want_ids and counts.tolist() == want_counts
    counted = tok.counted()[ids]
    assert counted.tolist() == [b != "" and set(b) <= set("ACGT") for b in bases] and counted.sum() > 100


def test_bpe_dropout_is_refused_in_one_line(tmp_path):
    """BPE dropout skips merges at random (the same bases get other ids from call to call): refused, naming it;
    0 (every merge) and 1 (none) give one answer and load."""
    from lcft.errors import LcftError
    from lcft.genomics.model_tokenizer import load_tokenizer

    data = json.loads(Path(_marked_bpe(tmp_path / "base.json")).read_text())
    for dropout, ok in ((0.1, False), (0.0, True), (1.0, True)):
        data["model"]["dropout"] = dropout
        (tmp_path / "tokenizer.json").write_text(json.dumps(data))
        if ok:
            assert load_tokenizer(str(tmp_path / "tokenizer.json")).vocab_size == 120
            continue
        with pytest.raises(LcftError, match=r"dropout \(0.1\)") as e:
            load_tokenizer(str(tmp_path / "tokenizer.json"))
        assert "\n" not in str(e.value)



def _lacking_unknown_token(kind: str, tmp_path: Path, letters: str = "ACGT") -> str:
    """tokenizer.json text of a vocabulary of `letters` that names an unknown token it does not hold (Unigram:
    none), so the tokenizers library raises on the first other letter."""
    vocab = {b: i for i, b in enumerate(letters)}
    if kind == "bpe":  # the unknown token among the added tokens only, not in the model's vocab; no regex to probe
        data = json.loads(Path(_marked_bpe(tmp_path / "bpe.json")).read_text())
        del data["model"]["vocab"]["<unk>"]
        data["pre_tokenizer"] = None
        return json.dumps(data)
    tk = {"wordpiece": lambda: Tokenizer(models.WordPiece({**vocab, "[UNK]": len(vocab)}, unk_token="[MISSING]")),
          "unigram": lambda: Tokenizer(models.Unigram([(b, -1.0) for b in letters], unk_id=None)),
          "wordlevel": lambda: Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))}[kind]()
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return tk.to_str()


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram", "wordlevel"])
def test_a_missing_unknown_token_is_one_line(kind, tmp_path):
    """Without its unknown token the library raises on a letter it has no token for: lcft says so in one line,
    naming the library's reason, as the file is loaded (for N) or as a sequence is cut (any other letter)."""
    from lcft.errors import LcftError
    from lcft.genomics.model_tokenizer import load_tokenizer
    from lcft.genomics.seq_tokenizer import UPPER

    path = tmp_path / "tokenizer.json"
    path.write_text(_lacking_unknown_token(kind, tmp_path))
    with pytest.raises(Exception) as lib:  # the oracle: the library itself fails on N
        Tokenizer.from_file(str(path)).encode("ACGTN")
    with pytest.raises(LcftError) as e:
        load_tokenizer(str(path))
    assert "\n" not in str(e.value) and f"failed on 'N' ({lib.value})" in str(e.value)
    if kind == "bpe":
        return
    path.write_text(_lacking_unknown_token(kind, tmp_path, "ACGTN"))  # loads; fails on the first X
    tok = load_tokenizer(str(path))
    raw = np.frombuffer(b"ACGTNNXAC", np.uint8)
    with pytest.raises(LcftError, match=r"failed on this sequence \(.*(unk|UNK).*\)$"):
        tok.encode_chunk(UPPER[raw], tok.pieces(raw, 0))


def test_a_dropped_letter_is_named_not_its_neighbour(tmp_path):
    """A BPE without an unknown token (as `tokenizers` writes one trained without it) drops R, a letter it has no
    token for; the library's offsets then shift onto the N after it (the oracle below), yet the refusal names R
    and not N, which has a token."""
    from lcft.errors import LcftError

    tk = Tokenizer(models.BPE(vocab={b: i for i, b in enumerate("ACGTN")}, merges=[]))
    (tmp_path / "tok").mkdir()
    tk.save(str(tmp_path / "tok" / "tokenizer.json"))
    assert tk.encode("R").ids == [] and tk.encode("N").ids == [4]
    assert tk.encode("NRN").offsets == [(0, 1), (1, 2)]  # as if R were covered and the second N dropped
    (tmp_path / "r.fa").write_text(">r\n" + "ACGT" * 8 + "NRN" + "ACGT" * 8 + "\n")
    with pytest.raises(LcftError, match=r"drops letter R \(no token for it") as e:
        prepare_windows(fasta=str(tmp_path / "r.fa"), out=str(tmp_path / "out"), length=8, train=("r",), eval=(),
                        max_n_frac=1.0, max_oov_frac=1.0, tokenizer=str(tmp_path / "tok"))
    assert "N" not in str(e.value).split("drops letter ")[1].split(" (")[0]


def test_a_word_start_mark_that_is_a_letter_is_refused_in_one_line(tmp_path):
    """A Metaspace writing a letter before each word: which letters of a token are bases cannot be told, so the
    tokenizer is refused in one line naming the mark."""
    from lcft.errors import LcftError
    from lcft.genomics.model_tokenizer import load_tokenizer

    with pytest.raises(LcftError, match="word-boundary mark 'X' holds a letter") as e:
        load_tokenizer(_marked_bpe(tmp_path / "tokenizer.json", replacement="X"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["kmer:3", "char"])
@pytest.mark.parametrize("change", ["unknown", "added"])
def test_a_kmer_file_whose_own_ids_differ_from_its_reading_is_refused(kind, change, tmp_path):
    """A K-mer WordLevel tokenizer.json (char's export too) is read by its vocabulary and split alone; its model's
    unknown token, or an added token of bases (matched before the split), makes `tokenizers` give other ids for
    the same DNA: such a file is refused in one line, and lcft's own file (unchanged) reads to the ids the library
    gives."""
    from lcft.errors import LcftError
    from lcft.genomics.hf_tokenizer import hf_tokenizer_json
    from lcft.genomics.model_tokenizer import load_tokenizer
    from lcft.genomics.tokenizer import encode

    data = json.loads(hf_tokenizer_json(load_tokenizer(kind)))
    dna = "TACGTTRTAXACGGN"
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    tok, raw = load_tokenizer(str(path)), np.frombuffer(dna.encode(), np.uint8)
    ids = encode(raw).tolist() if kind == "char" else tok.encode_chunk(raw, tok.pieces(raw, 0))[0].tolist()
    assert ids == Tokenizer.from_file(str(path)).encode(dna, add_special_tokens=False).ids  # the oracle
    if change == "unknown":
        data["model"]["unk_token"] = "<pad>"
    else:
        data["added_tokens"].append({"id": data["model"]["vocab"]["ACG" if kind != "char" else "C"], "content": "ACG",
                                     "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": False})
    path.write_text(json.dumps(data))
    assert Tokenizer.from_file(str(path)).encode(dna, add_special_tokens=False).ids != ids  # the file's own ids
    with pytest.raises(LcftError, match="encodes DNA otherwise than lcft reads its vocabulary") as e:
        load_tokenizer(str(path))
    assert "\n" not in str(e.value)


def test_a_kmer_text_the_library_cannot_read_is_one_line():
    """A K-mer tokenizer.json text (as kept with windows) that `tokenizers` refuses is one line naming it: lcft's
    reading of its vocabulary and split alone would have taken it."""
    from lcft.errors import LcftError
    from lcft.genomics.model_tokenizer import load_tokenizer, tokenizer_from_json_text

    data = json.loads(load_tokenizer("kmer:3").json_text)
    data["pre_tokenizer"]["behavior"] = "Bogus"
    with pytest.raises(LcftError, match=r"^tokenizer kept: the tokenizers library failed on its file \(unknown variant"):
        tokenizer_from_json_text(json.dumps(data), "kept")
