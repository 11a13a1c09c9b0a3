"""Model tokenizers: bad tokenizer input (one-line errors, nothing written), unknown-token counting and refusal,
and a SIGKILLed k-mer run that resumes to the same bytes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from lcft.errors import LcftError
from lcft.genomics import open_windows, prepare_windows, verify_windows
from lcft.genomics.hf_tokenizer import save_hf_tokenizer
from lcft.genomics.model_tokenizer import load_tokenizer
from tests.conftest import SHARED_GENOMES
from tests.genomics.conftest import random_genome, write_fasta
from tests.test_files import plant

L = 1024


@pytest.fixture
def fasta(tmp_path):
    return write_fasta(tmp_path / "g.fa", {"c1": random_genome(1, 40 * L), "c2": random_genome(2, 40 * L)})


def fails(match: str, fasta: Path, out: Path, **kw) -> str:
    kw = {"length": L, "train": ("c1",), "eval": ()} | kw
    with pytest.raises(LcftError, match=match) as e:
        prepare_windows(fasta=str(fasta), out=str(out), **kw)
    assert "\n" not in str(e.value)
    assert not out.exists() or not any(out.iterdir()), f"left behind: {list(out.iterdir())}"
    return str(e.value)


def test_tokenizer_file_missing(fasta, tmp_path):
    fails("no such file or folder", fasta, tmp_path / "out", tokenizer=str(tmp_path / "nope.json"))



@pytest.mark.parametrize(("kind", "said"), [("FIFO", "a FIFO"), ("link to /dev/zero", "a character device")])
def test_a_tokenizer_that_is_no_regular_file_says_what_it_is(fasta, tmp_path, kind, said):
    """--tokenizer naming a FIFO or a link to /dev/zero said "no such file or folder", which it is not."""
    tok = plant(tmp_path / "tokenizer.json", kind)
    fails(f"^tokenizer {tok} is {said}, not a regular file$", fasta, tmp_path / "out", tokenizer=str(tok))

@pytest.mark.parametrize(("given", "meant"), [("kmer6", "kmer:6"), ("KMER:6", "kmer:6"), ("6mer", "kmer:6"),
                                              ("Char", "char")])
def test_a_misspelt_builtin_tokenizer_names_the_close_match(fasta, tmp_path, monkeypatch, given, meant):
    monkeypatch.chdir(tmp_path)  # (no file of that name)
    fails(f"tokenizer {given}: no such file or folder .*\\(did you mean '{meant}'\\?\\)$", fasta, tmp_path / "out",
          tokenizer=given)


def test_a_kmer_vocab_txt_given_itself_is_read_as_its_folder(tmp_path):
    """DNABERT-6's vocab.txt named itself (it had been parsed as a tokenizer.json: 'not valid JSON'): the
    tokenizer its folder gives, K from the folder's files."""
    folder = SHARED_GENOMES.parent / "published" / "dnabert-6"
    by_file, by_folder = load_tokenizer(str(folder / "vocab.txt")), load_tokenizer(str(folder))
    assert (by_file.k, by_file.vocab, by_file.roles) == (by_folder.k, by_folder.vocab, by_folder.roles)
    assert by_file.k == 6 and by_file.vocab_size == 4101 and by_file.roles["pad_token"] == "[PAD]"


def test_tokenizer_folder_without_tokenizer_json(fasta, tmp_path):
    (tmp_path / "model").mkdir()
    fails("holds no tokenizer.json", fasta, tmp_path / "out", tokenizer=str(tmp_path / "model"))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"model": {"type": "Nope"}}'])
def test_tokenizer_not_a_tokenizer_json(fasta, tmp_path, text):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(text)
    fails("is not a (tokenizers )?tokenizer.json", fasta, tmp_path / "out", tokenizer=str(bad))


def test_tokenizer_without_a_base(fasta, tmp_path):
    """A WordLevel tokenizer that knows A, C and T but not G."""
    tk = Tokenizer(models.WordLevel({"<unk>": 0, "A": 1, "C": 2, "T": 3}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.save(str(tmp_path / "tokenizer.json"))
    msg = fails("has no token for base G", fasta, tmp_path / "out", tokenizer=str(tmp_path / "tokenizer.json"))
    assert "A" not in msg.split("base")[-1]


@pytest.mark.parametrize("spec", ["kmer:0", "kmer:x", "kmer:11", "kmer:12", "kmer:"])
def test_bad_kmer_spec(fasta, tmp_path, spec):
    fails("K must be a whole number from 1 to 10", fasta, tmp_path / "out", tokenizer=spec)


def test_the_largest_kmer_vocabulary_fits_a_model():
    """kmer:11 prepared its windows (29 s, 2 GB), then train refused their vocabulary of 4^11 + 4; kmer:12
    ran out of memory building its table. The largest K lcft takes makes a vocabulary a model can have."""
    from lcft.genomics.kmer_tokenizer import builtin_kmer_vocab
    from lcft.model.config import COUNT_LIMITS
    from lcft.vocab import MAX_K

    assert len(builtin_kmer_vocab(MAX_K)) <= COUNT_LIMITS["vocab_size"] < len(builtin_kmer_vocab(MAX_K + 1))


def test_a_sparse_tokenizer_is_refused(fasta, tmp_path):
    """Seven tokens, one of them at id 4,194,303: the model's vocabulary (the highest id + 1) would have made a
    preset's embedding and head 4M rows each from a 491-byte file."""
    vocab = {"[UNK]": 3, "A": 4, "C": 5, "G": 6, "T": 7, "N": 8, "[PAD]": (1 << 22) - 1}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.save(str(tmp_path / "tokenizer.json"))
    fails("its ids run to 4,194,303 for 7 tokens", fasta, tmp_path / "out", tokenizer=str(tmp_path / "tokenizer.json"))


def _json_tokenizer(folder: Path, model: dict, **fields) -> Path:
    """A tokenizer.json of `model`, no pipeline, written in `folder`; `fields` replace its top-level ones."""
    folder.mkdir(exist_ok=True)
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model, **fields}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("model", [{"type": "WordLevel", "vocab": {}, "unk_token": "<unk>"},
                                   {"type": "Unigram", "unk_id": None, "vocab": []}])
def test_a_tokenizer_without_tokens_is_one_line(fasta, tmp_path, model):
    """A tokenizer.json whose model and added_tokens hold no token was a ValueError traceback (max() of an empty
    vocabulary) from prepare, and from export of a model folder holding it."""
    folder = _json_tokenizer(tmp_path / "tok", model)
    fails("the vocabulary has no tokens", fasta, tmp_path / "out", tokenizer=str(folder))


VOCAB = {"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": 4, "N": 5}
WORDS = {"type": "WordLevel", "vocab": VOCAB, "unk_token": "<unk>"}
BASES = {"type": "BPE", "vocab": VOCAB, "merges": [], "unk_token": "<unk>"}  # a token a base, as prepare reads DNA


def template(i: int) -> dict:
    """A TemplateProcessing putting special token X (id `i`) before each sequence."""
    return {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "X", "type_id": 0}},
                                                     {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"X": {"id": "X", "ids": [i], "tokens": ["X"]}}}


def bert(i: int) -> dict:
    """A Sequence of one BertProcessing whose sep token has id `i`."""
    return {"type": "Sequence", "processors": [{"type": "BertProcessing", "sep": ["</s>", i], "cls": ["<unk>", 0]}]}


@pytest.mark.parametrize(("processor", "match"), [
    (template(6), "special token 'X' has id 6, beyond the vocabulary .ids 0 to 5."),
    (template(4294967295), "special token 'X': id 4294967295 is not a whole number from 0 to"),
    (bert(1000), "special token '</s>' has id 1000, beyond the vocabulary"),
])
def test_a_post_processor_id_beyond_the_vocabulary_is_refused(fasta, tmp_path, processor, match):
    """A post_processor adding a special token of an id past the vocabulary loaded and was carried into the
    prepared data and the export, whose encodings (special tokens on) would index past the embedding."""
    folder = _json_tokenizer(tmp_path / "tok", WORDS, post_processor=processor)
    assert max(Tokenizer.from_file(str(folder / "tokenizer.json")).encode("A").ids) >= len(VOCAB)  # as the library
    fails(match, fasta, tmp_path / "out", tokenizer=str(folder))


@pytest.mark.parametrize("processor", [template(5), bert(5)])
def test_a_post_processor_id_of_the_vocabulary_is_kept(tmp_path, processor):
    folder = _json_tokenizer(tmp_path / "tok", WORDS, post_processor=processor)
    assert load_tokenizer(str(folder)).vocab_size == len(VOCAB)


def many_specials(n: int) -> dict:
    """A Sequence of a TemplateProcessing declaring `n` special tokens (and X), each of id 5, beside bert(5):
    3 processors + 3 entries a special token (itself, its id, its token) + 3 template pieces."""
    specials = {f"S{j}": {"id": f"S{j}", "ids": [5], "tokens": ["N"]} for j in range(n)}
    return {"type": "Sequence", "processors": [{**template(5), "special_tokens": {**specials, "X": {
        "id": "X", "ids": [5], "tokens": ["X"]}}}, bert(5)]}


def test_a_post_processor_declaring_too_many_entries_is_refused(fasta, tmp_path):
    """Every entry a post_processor declares costs lcft and the library far more than a vocabulary entry (100,000
    special tokens: seconds and hundreds of MB to load); only the file's size bounded them. Over
    MAX_PROCESSOR_ENTRIES they are refused in one line before anything is built; at the limit the tokenizer loads."""
    from lcft.genomics.vocab_file import MAX_PROCESSOR_ENTRIES

    at_limit = (MAX_PROCESSOR_ENTRIES - 3 - 3 - 3) // 3
    declared = 3 + 3 * (at_limit + 2) + 3
    over = _json_tokenizer(tmp_path / "over", BASES, post_processor=many_specials(at_limit + 1))
    Tokenizer.from_file(str(over / "tokenizer.json"))  # the library reads it
    fails(rf"post_processor declares {declared:,} entries .*, over the limit of {MAX_PROCESSOR_ENTRIES:,}$", fasta,
          tmp_path / "out", tokenizer=str(over))
    ok = _json_tokenizer(tmp_path / "ok", BASES, post_processor=many_specials(at_limit))
    prepare_windows(fasta=str(fasta), out=str(tmp_path / "out"), length=L, train=("c1",), eval=(), tokenizer=str(ok))


def test_kmer_vocab_file_missing(fasta, tmp_path):
    fails("no such file", fasta, tmp_path / "out", tokenizer=f"kmer:6:{tmp_path / 'vocab.txt'}")


def test_kmer_vocab_path_is_saved_absolute(fasta, tmp_path, monkeypatch):
    """kmer:K:PATH given relative: prepare.toml names the vocabulary by its absolute path (it kept the text as
    given, so `--config prepare.toml` from another folder read no vocabulary)."""
    from lcft.config_toml import load_toml
    from lcft.genomics.kmer_tokenizer import builtin_kmer_vocab

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "vocab.txt").write_text("\n".join(builtin_kmer_vocab(2)) + "\n")
    monkeypatch.chdir(tmp_path)
    prepare_windows(fasta=str(fasta), out="out", length=L, train=("c1",), eval=(), tokenizer="kmer:2:model/vocab.txt")
    saved = load_toml(tmp_path / "out" / "prepare.toml")
    assert saved["tokenizer"] == f"kmer:2:{tmp_path / 'model' / 'vocab.txt'}"
    assert load_tokenizer(saved["tokenizer"]).vocab == builtin_kmer_vocab(2)


def test_kmer_vocab_folder_without_a_vocabulary(fasta, tmp_path):
    """kmer:6:FOLDER where the folder (a model's, config.json only) holds neither file: the error names the folder
    given and both files looked for (it had named a FOLDER/tokenizer.json the user never gave)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    msg = fails(r"holds no vocab\.txt or tokenizer\.json", fasta, tmp_path / "out", tokenizer=f"kmer:6:{tmp_path / 'model'}")
    assert f"{tmp_path / 'model'} " in msg


def test_cli_one_line_error(fasta, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "lcft", "prepare", "windows", "--fasta", str(fasta), "--out", str(out),
                        "--length", str(L), "--train", "c1", "--eval", "", "--tokenizer", "kmer:0"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "kmer:0" in r.stderr
    assert not out.exists()


def oov_genome(tmp_path: Path, every: int) -> tuple[Path, str]:
    """c1 with an 'X' (no token for it) every `every` bases, and one 'R' (an IUPAC code)."""
    seq = list(random_genome(3, 30 * L, n_runs=0))
    for i in range(5, len(seq), every):
        seq[i] = "X"
    seq[7] = "R"
    s = "".join(seq)
    return write_fasta(tmp_path / "x.fa", {"c1": s}), s


@pytest.mark.parametrize("spec", ["kmer:6", "char"])
def test_unknown_letters_refused_above_threshold(tmp_path, spec):
    path, _ = oov_genome(tmp_path, every=50)
    msg = fails("unknown token", path, tmp_path / "out", tokenizer=spec)
    assert "'X'" in msg and "--max-oov-frac 0.01" in msg and "train" in msg


def test_unknown_tokens_counted_per_split(tmp_path):
    """kmer:6: the 6-mer holding an X is one unknown token; the manifest's count equals the ids in the files
    and an independent `tokenizers` count over the kept windows' bases."""
    path, seq = oov_genome(tmp_path, every=500)
    out = tmp_path / "out"
    m = prepare_windows(fasta=str(path), out=str(out), length=L, train=("c1",), eval=(), tokenizer="kmer:6",
                        max_oov_frac=0.5)
    ws = open_windows(out, "train")
    unk = m["tokenizer"]["unk_id"]
    in_files = sum(int((ws[i] == unk).sum()) for i in range(len(ws)))
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    oracle = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    oracle.pre_tokenizer = pre_tokenizers.Split(Regex(".{6}|."), behavior="isolated")  # N/X inside 6-mers
    spans = [seq[ws.coords(i)[1] : ws.coords(i)[2]].upper() for i in range(len(ws))]
    assert m["splits"]["train"]["oov"] == in_files == sum(oracle.encode(s).ids.count(unk) for s in spans) > 0
    assert set(m["splits"]["train"]["oov_letters"]) <= {"X", "R"} and m["splits"]["train"]["oov_letters"]["X"] > 0
    spelled = "".join(t if t in vocab else "N" * len(t) for t in re.findall(".{6}|.", spans[0]))
    assert ws.sequence(0).upper() == spelled  # an unknown token (the 6-mer holding X or R) reads back as N


@pytest.mark.parametrize("spec", ["kmer:6", "char"])
def test_unknown_letters_are_those_of_the_kept_windows(tmp_path, spec):
    """`oov_letters` names the letters behind the unknown tokens the split holds: not those of windows skipped for
    N, nor of the record's tail past the last window (kmer:6 had counted every unknown token of the record)."""
    seq = list(random_genome(4, 60 * L, n_runs=0))
    for i in range(5, len(seq), 700):
        seq[i] = "X"  # in every window
    seq[18432:21432] = "N" * 3000  # windows skipped for N under both tokenizers...
    for i in range(18500, 21400, 50):
        seq[i] = "X"  # ...holding many more X
    s = "".join(seq)
    path, out = write_fasta(tmp_path / "x.fa", {"c1": s}), tmp_path / "out"
    m = prepare_windows(fasta=str(path), out=str(out), length=L, train=("c1",), eval=(), tokenizer=spec,
                        max_oov_frac=0.5)
    ws = open_windows(out, "train")
    spans = [s[ws.coords(i)[1] : ws.coords(i)[2]].upper() for i in range(len(ws))]
    if spec == "char":  # <unk>: a letter neither A/C/G/T/N nor an IUPAC code
        behind = [ch for span in spans for ch in span if ch not in "ACGTNRYSWKMBDHVU"]
    else:  # 6-mers from the record's first base; the letters other than A/C/G/T of those missing from the vocab
        vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
        unknown = [t for span in spans for t in re.findall(".{6}|.", span) if t not in vocab]
        behind = [ch for t in unknown for ch in t if ch not in "ACGT"]
    assert m["splits"]["train"]["skipped_n"] > 0 and s.count("X") > len(behind) > 0
    assert m["splits"]["train"]["oov_letters"] == {"X": len(behind)}


KILLER = textwrap.dedent("""
    import json, os, signal, sys
    import lcft.genomics.prepare as P
    from lcft.genomics.shards import SplitWriter
    seen = {"ckpt": 0, "adds": 0}
    real_json, real_add = P.write_json_atomic, SplitWriter.add
    def json_hook(path, data, **kw):
        real_json(path, data, **kw)
        seen["ckpt"] += 1
    def add_hook(self, *arrays):
        real_add(self, *arrays)
        if seen["ckpt"] >= 1:
            seen["adds"] += 1
            if seen["adds"] == 3:
                self.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    P.write_json_atomic, SplitWriter.add = json_hook, add_hook
    kw = {"length": 1024, "train": ("c1", "c2"), "eval": (), "tokenizer": "kmer:6"} | json.loads(sys.argv[3:] and sys.argv[3] or "{}")
    P.prepare_windows(fasta=sys.argv[1], out=sys.argv[2], **kw)
""")


def test_sigkill_midway_then_resume_is_byte_identical(fasta, tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", KILLER, str(fasta), str(out)], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()
    assert not (out / "manifest.json").exists()
    kw = {"length": L, "train": ("c1", "c2"), "eval": (), "tokenizer": "kmer:6"}
    prepare_windows(fasta=str(fasta), out=str(out), **kw)
    prepare_windows(fasta=str(fasta), out=str(tmp_path / "clean"), **kw)
    names = sorted(p.name for p in (tmp_path / "clean").iterdir())
    assert "train.bases.bin" in names and "train.basemask.bin" in names and "tokenizer.json" in names
    assert names == sorted(p.name for p in out.iterdir())
    for name in set(names) - {"prepare.toml"}:  # (prepare.toml names the output folder)
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
    verify_windows(out)
    (out / "tokenizer.json").write_text((out / "tokenizer.json").read_text().replace('"A"', '"a"'))
    with pytest.raises(LcftError, match="tokenizer.json is corrupt"):
        verify_windows(out)
    assert np.array_equal(open_windows(tmp_path / "clean", "train").base_offsets(0)[:3], [0, 6, 12])


def lettered_genome(tmp_path: Path) -> Path:
    """c1 (2.4 Mbp: more than one 2 Mbp read) and c2 with letters no tokenizer here has a token for, upper and
    lower case, scattered and packed into the N runs (whose windows the N filter drops)."""
    rng = np.random.default_rng(9)
    records = {}
    for name, n in (("c1", 2_400_000), ("c2", 240_000)):  # (multiples of 6: no k-mer tail)
        seq = np.frombuffer(random_genome(len(name) + n, n).encode(), np.uint8).copy()
        at = rng.integers(0, n, n // 400)
        seq[at] = np.frombuffer(b"XRYxrnN", np.uint8)[rng.integers(0, 7, at.size)]
        runs = np.flatnonzero(seq == ord("N"))
        seq[runs[::37]] = ord("X")
        records[name] = seq.tobytes().decode()
    return write_fasta(tmp_path / "lettered.fa", records)


def letters_of_kept_windows(fasta: Path, manifest: dict, split: str, known: str) -> dict[str, int]:
    """The oracle: letters (upper-cased) that are not in `known` over every kept window's bases, a base counted
    once per window holding it, read with Biopython."""
    from Bio import SeqIO

    seqs = {r.id: str(r.seq).upper() for r in SeqIO.parse(str(fasta), "fasta")}
    drop = str.maketrans("", "", known)
    count: Counter = Counter()
    for r in manifest["records"]:
        if r["split"] == split:
            count.update(seqs[r["chrom"]][r["start"] : r["end"]].translate(drop))
    return dict(count)


@pytest.mark.parametrize(("model", "known"), [("dnabert-6", "ACGT"), ("metagene-1", "ACGTN")])
def test_oov_letters_equal_a_count_over_the_kept_windows_fresh_and_resumed(tmp_path, model, known):
    """Published tokenizers: DNABERT-6's 6-mers have no N (a 6-mer holding any letter but A/C/G/T is unknown, so
    all such letters are behind one), METAGENE-1's BPE knows N (each other letter is its own unknown token).
    Overlapping windows (stride half the length), some dropped for N: `oov_letters` per split equals the oracle,
    also for a run killed in c2 and resumed."""
    fasta, spec = lettered_genome(tmp_path), str(SHARED_GENOMES.parent / "published" / model)
    kw = {"length": L, "stride": L // 2, "train": ("c1", "c2"), "eval": (), "tokenizer": spec, "max_oov_frac": 1.0}
    m = prepare_windows(fasta=str(fasta), out=str(tmp_path / "clean"), **kw)
    want = letters_of_kept_windows(fasta, m, "train", known)
    assert m["splits"]["train"]["skipped_n"] > 0 and set(want) >= {"X", "R", "Y"}
    assert m["splits"]["train"]["oov_letters"] == want
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", KILLER, str(fasta), str(out), json.dumps(kw)], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()
    state = json.loads((out / ".partial" / "state.json").read_text())
    assert [c["chrom"] for c in state["chroms"]] == ["c1"] and state["oov_letters"]["train"]  # c1's, kept
    resumed = prepare_windows(fasta=str(fasta), out=str(out), **kw)
    assert resumed["splits"]["train"]["oov_letters"] == want


def test_a_padding_block_is_not_taken_for_growth(fasta, tmp_path):
    """A tokenizer.json with a normalizer, saved with padding to 512 tokens, was refused as a tokenizer that gives
    512 tokens for one base: its probe encoded with the file's padding, which lcft never applies. It prepares the
    ids the library gives without the padding (with it, the library pads "A" with id 1000, beyond the vocabulary),
    and its export has no padding for transformers to apply."""
    units = {"type": "Unigram", "unk_id": 0, "vocab": [[t, 0.0 if t == "<unk>" else -1.0] for t in VOCAB]}
    padding = {"strategy": {"Fixed": 512}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 1000,
               "pad_type_id": 0, "pad_token": "<pad>"}
    folder = _json_tokenizer(tmp_path / "tok", units, padding=padding,
                             normalizer={"type": "Replace", "pattern": {"String": "X"}, "content": "X"})
    library = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert library.encode("A").ids == [1] + [1000] * 511
    prepare_windows(fasta=str(fasta), out=str(tmp_path / "out"), length=L, train=("c1",), eval=(),
                    tokenizer=str(folder))
    ws, text = open_windows(tmp_path / "out", "train"), fasta.read_text().split("\n", 1)[1].split(">")[0]
    library.no_padding()
    _, start, end = ws.coords(0)
    assert ws[0].tolist() == library.encode(text.replace("\n", "")[start:end].upper()).ids
    save_hf_tokenizer(load_tokenizer(str(folder)), tmp_path / "export")
    exported = Tokenizer.from_file(str(tmp_path / "export" / "tokenizer.json"))
    assert exported.padding is None and exported.encode("A").ids == [1]
