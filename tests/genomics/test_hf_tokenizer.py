"""Exported tokenizer files: transformers.AutoTokenizer encodes DNA to exactly the ids prepare wrote (char, 6-mers,
BPEs trained here, plain and with SentencePiece's word-start mark), on real sequence with soft-masked bases, an N
run and ambiguity codes; letter added tokens, a normalizer turning other letters into bases and a word-start mark
of the file's own included."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from lcft.genomics import open_windows, prepare_windows
from lcft.genomics.hf_tokenizer import save_hf_tokenizer
from tests.genomics.conftest import bio_records, write_fasta

transformers = pytest.importorskip("transformers")
L = 64


@pytest.fixture(scope="module")
def records():
    """Six 4000-base records of the hg38 piece (both cases), one across the N telomere's end, one with IUPAC."""
    from tests.conftest import SHARED_GENOMES

    seq = bio_records(SHARED_GENOMES / "hg38_chr2_1-2333275.fa.gz")["chr2"]
    recs = {f"r{i}": seq[s : s + 4000] for i, s in enumerate((8000, 50_000, 123_457, 700_001, 1_500_000))}
    recs["r5"] = "ACGTRYKMacgtnnSWacgt" * 200
    return recs, seq


def bpe(tmp_path, seq, kind="bpe"):
    """A BPE of 300 trained here; `bpe-first`: SentencePiece's word-start mark on the string's first piece only
    (Metaspace, prepend_scheme first), `bpe-prepend`: the mark put by a Prepend normalizer (Llama's older form),
    `bpe-mark`: a mark of its own ('_') on the first piece, `bpe-n2a`: a normalizer turning N into A and R into G,
    `bpe-added`: added tokens of letters, matched before normalizing or after, one only as a whole word,
    `bpe-lower`: a lower-case added token behind a lower-casing normalizer, `bpe-iupac`: a normalizer turning every
    letter but A/C/G/T/N into N (the run edges are not marked: it would turn the mark into N)."""
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=kind != "bpe"))
    if kind == "bpe-first":
        tk.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    if kind == "bpe-prepend":
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    if kind == "bpe-mark":
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="_", prepend_scheme="first")
    if kind == "bpe-lower":
        tk.normalizer = normalizers.Lowercase()
    if kind == "bpe-iupac":
        tk.normalizer = normalizers.Replace(Regex("[^ACGTN]"), "N")
    if kind == "bpe-n2a":
        tk.normalizer = normalizers.Sequence([normalizers.Replace("N", "A"), normalizers.Replace("R", "G")])
    tk.train_from_iterator((seq[i : i + 1000].upper() for i in range(0, 400_000, 1000)),
                           trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<unk>"], show_progress=False))
    if kind == "bpe-added":
        tk.add_tokens([AddedToken("N", normalized=False), AddedToken("ACGT", normalized=False), AddedToken("GGC"),
                       AddedToken("NNNN", normalized=False, single_word=True)])
        tk.add_special_tokens([AddedToken("RY", normalized=False, special=True)])
    if kind == "bpe-lower":
        tk.add_tokens([AddedToken("acgt"), AddedToken("nn")])
    tk.save(str(tmp_path / "bpe.json"))
    return str(tmp_path / "bpe.json")


KINDS = ["bpe", "bpe-first", "bpe-prepend", "bpe-mark", "bpe-n2a", "bpe-added", "bpe-lower", "bpe-iupac"]


@pytest.mark.parametrize("kind", ["char", "kmer:6", *KINDS])
def test_autotokenizer_encodes_to_the_prepared_ids(kind, records, tmp_path):
    recs, seq = records
    spec = bpe(tmp_path, seq, kind) if kind.startswith("bpe") else kind
    fasta = write_fasta(tmp_path / "r.fa", recs)
    out = tmp_path / "out"
    prepare_windows(fasta=str(fasta), out=str(out), length=L, train=tuple(recs), eval=(), max_n_frac=1.0,
                    max_oov_frac=1.0, tokenizer=spec)
    ws = open_windows(out, "train")
    export = tmp_path / "export"
    save_hf_tokenizer(ws.tokenizer, export)
    auto = transformers.AutoTokenizer.from_pretrained(str(export))
    checked = 0
    for name, rec in recs.items():
        wins = [i for i in range(len(ws)) if ws.coords(i)[0] == name]
        want = [t for i in wins for t in ws[i].tolist()]
        got = auto(rec, add_special_tokens=False)["input_ids"]
        assert got[: len(want)] == want and len(got) - len(want) < L, name
        checked += len(want)
    assert checked > 0


@pytest.mark.parametrize("kind", ["kmer:6", *KINDS])
def test_exported_tokenizer_has_the_data_content_hash(kind, records, tmp_path):
    """An exported folder, read back as a tokenizer, hashes like the data it came from (train compares these), and
    exported again (lcft export writes a checkpoint's copy) is the same file; another vocabulary does not."""
    from lcft.genomics.model_tokenizer import load_tokenizer

    recs, seq = records
    spec = bpe(tmp_path, seq, kind) if kind.startswith("bpe") else kind
    fasta = write_fasta(tmp_path / "r.fa", recs)
    m = prepare_windows(fasta=str(fasta), out=str(tmp_path / "out"), length=L, train=tuple(recs), eval=(),
                        max_n_frac=1.0, max_oov_frac=1.0, tokenizer=spec)
    save_hf_tokenizer(open_windows(tmp_path / "out", "train").tokenizer, tmp_path / "export")
    again = load_tokenizer(str(tmp_path / "export"))
    assert again.sha256() == m["tokenizer"]["sha256"] and again.name == m["tokenizer"]["name"]
    save_hf_tokenizer(again, tmp_path / "export2")  # a checkpoint's copy, exported: the same file
    assert (tmp_path / "export2" / "tokenizer.json").read_text() == (tmp_path / "export" / "tokenizer.json").read_text()
    assert load_tokenizer("kmer:5").sha256() != m["tokenizer"]["sha256"]


def test_export_tokenizer_char_default_and_spec_comparison(tmp_path):
    """A checkpoint without tokenizer.json exports lcft's char vocabulary; specs compare by content hash."""
    from lcft.genomics.hf_tokenizer import export_tokenizer, folder_tokenizer_spec, same_tokenizer
    from lcft.genomics.model_tokenizer import load_tokenizer

    (tmp_path / "ckpt").mkdir()
    export_tokenizer(tmp_path / "ckpt", tmp_path / "out")
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert auto("acgtNRyX", add_special_tokens=False)["input_ids"] == [4, 5, 6, 7, 8, 8, 8, 3]
    assert folder_tokenizer_spec(tmp_path / "ckpt") is None
    save_hf_tokenizer(load_tokenizer("kmer:4"), tmp_path / "k4")
    spec = folder_tokenizer_spec(tmp_path / "k4")
    assert same_tokenizer(spec, load_tokenizer("kmer:4").spec())
    assert not same_tokenizer(spec, load_tokenizer("kmer:3").spec())


@pytest.mark.parametrize(("token", "normalizer"), [
    (AddedToken("acgt"), None), (AddedToken("n", normalized=False), None), (AddedToken("ACGTN"), None),
    (AddedToken("NNN", normalized=False), normalizers.NFKC())])
def test_prepare_refuses_an_added_token_its_export_cannot_match_alike(token, normalizer, tmp_path):
    """An added token prepare never matches (lcft upper-cases, then encodes runs apart) but transformers would, or
    one matched before a normalizer of the file: prepare (and export) refuse in one line naming a sequence."""
    from lcft.errors import LcftError
    from lcft.genomics.hf_tokenizer import prepare_tokenizer
    from lcft.genomics.model_tokenizer import load_tokenizer

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.normalizer = normalizer
    tk.train_from_iterator(["ACGTNNACGGTACAN" * 20], trainers.BpeTrainer(vocab_size=40, special_tokens=["<unk>"],
                                                                         show_progress=False))
    tk.add_tokens([token])
    tk.save(str(tmp_path / "tokenizer.json"))
    for call in (lambda: prepare_tokenizer(str(tmp_path / "tokenizer.json")),
                 lambda: save_hf_tokenizer(load_tokenizer(str(tmp_path / "tokenizer.json")), tmp_path / "export")):
        with pytest.raises(LcftError, match="encodes DNA as prepare does: '.*' would encode to") as e:
            call()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, rebuilt", [("kmer:3", True), ("kmer:03", True), ("kmer:0", False),
                                           ("kmer:11", False), ("kmer:3:vocab.txt", False), ("kmer:x", False)])
def test_a_checkpoint_without_tokenizer_files_rebuilds_only_lcfts_own_kmer_vocabulary(tmp_path, name, rebuilt):
    """A checkpoint folder with no tokenizer.json: the spec its lcft.json records is rebuilt when it names a
    built-in kmer:K (K 1..10) of the same hash, and is one line naming the spec otherwise."""
    from lcft.errors import LcftError
    from lcft.genomics.hf_tokenizer import checkpoint_tokenizer
    from lcft.genomics.model_tokenizer import load_tokenizer

    spec = {**load_tokenizer("kmer:3").spec(), "name": name}
    if rebuilt:
        assert checkpoint_tokenizer(tmp_path, spec).spec() == load_tokenizer("kmer:3").spec()
    else:
        with pytest.raises(LcftError, match="not one lcft can rebuild"):
            checkpoint_tokenizer(tmp_path, spec)


@pytest.mark.parametrize("name", ["tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"])
def test_a_tokenizer_file_of_a_model_folder_that_is_no_file_is_refused_not_passed_over(tmp_path, name):
    """A model folder's tokenizer.json there but no regular file (a FIFO) read as none: a folder transformers wrote
    was given lcft's char vocabulary; a role file as one it lacks: its special tokens' roles went missing."""
    from lcft.genomics.hf_tokenizer import checkpoint_tokenizer
    from lcft.genomics.model_tokenizer import load_tokenizer
    from tests.one_line import one_line
    from tests.test_files import plant

    save_hf_tokenizer(load_tokenizer("kmer:3"), tmp_path / "model")
    path = plant(tmp_path / "model" / name, "FIFO")
    one_line(lambda: checkpoint_tokenizer(tmp_path / "model"), f"{path} is a FIFO, not a regular file")
