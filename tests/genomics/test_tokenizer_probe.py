"""A tokenizer.json that enlarges DNA (a normalizer writing more than it reads) is refused in one line as it is loaded,
before anything is encoded: the rule checked against what `tokenizers` itself writes for a few bases."""

from __future__ import annotations

import json
import re
import resource
import time
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers

from lcft.errors import LcftError
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.genomics.model_tokenizer import load_tokenizer, tokenizer_from_json_text
from lcft.genomics.normalizer_growth import RULE_LIMIT
from lcft.genomics.tokenizer_probe import GROWTH, MARKS

BLOCK = 4096
FDFA = "\ufdfa"  # one character NFKC writes as 18


def tokenizer_json(folder: Path, norm) -> Path:
    """A BPE of single bases (and the word-start mark) behind normalizer `norm`, written by `tokenizers`."""
    tk = Tokenizer(models.BPE(vocab={"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": 4, "N": 5, "\u2581": 6}, merges=[], unk_token="<unk>"))
    tk.normalizer = norm
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def written(path: Path, bases: str) -> int:
    """Characters the file's normalizer writes for `bases` (the library's own answer, on a short input)."""
    return len(Tokenizer.from_file(str(path)).normalizer.normalize_str(bases))


HOSTILE = {  # name: (normalizer, a short input it enlarges, the refusal)
    "Replace N by 1000 N": (lambda: normalizers.Replace("N", "N" * 1000), "N", "write 1,000 characters for one base"),
    "Prepend 100 marks": (lambda: normalizers.Prepend("\u2581" * 100), "A", "write 101 characters for one base"),
    "three Replace x5": (lambda: normalizers.Sequence([normalizers.Replace("A", "A" * 5)] * 3), "A",
                         "write 125 characters"),
    "Replace N, then NFKC": (lambda: normalizers.Sequence([normalizers.Replace("N", FDFA), normalizers.NFKC()]), "N",
                             "gives 18 tokens or characters for N alone"),
    "Replace NN by 10 N": (lambda: normalizers.Replace("NN", "N" * 10), "NN" * 8,
                          "gives 20,480 tokens or characters for a run of 4096 N"),
    # each NFKC writes the character as 18 with 3 spaces, each space replaced by it again (past the probe's memory
    # for a run of N): seven NFKCs after a rule that writes one, 18**7 from the file
    "Replace NN, NFKC x7": (lambda: normalizers.Sequence(
        [normalizers.Replace("NN", FDFA)] + [normalizers.NFKC(), normalizers.Replace(" ", FDFA)] * 6
        + [normalizers.NFKC()]), "NN", re.escape(f"can write {18**7:,.4g} characters for one base")),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_tokenizer_that_enlarges_dna_is_refused_at_load(name, tmp_path):
    norm, short, refusal = HOSTILE[name]
    path = tokenizer_json(tmp_path / "tok", norm())
    assert path.stat().st_size < 2000
    assert written(path, short) > GROWTH * len(short) + MARKS  # the library does enlarge these bases
    peak, t = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    with pytest.raises(LcftError, match=refusal) as e:
        load_tokenizer(str(path.parent))
    assert "\n" not in str(e.value) and time.monotonic() - t < 60
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KiB: nothing encoded here
    with pytest.raises(LcftError, match=refusal):  # the copy kept with prepared data (train, eval) as well
        tokenizer_from_json_text(path.read_text(), "kept")


@pytest.mark.parametrize(("norm", "loads"), [
    (lambda: normalizers.Replace("N", "NNNN"), True),  # 4 a base: GROWTH
    (lambda: normalizers.Replace("N", "NNNNN"), False),
    (lambda: normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]), True),
    (lambda: normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("R", "N")]), True),
])
def test_the_bound_is_growth_tokens_a_base(norm, loads, tmp_path):
    """At most GROWTH characters a base on a block-long run (and MARKS more) loads; one more is refused."""
    path = tokenizer_json(tmp_path / "tok", norm())
    assert (written(path, "N" * BLOCK) <= GROWTH * BLOCK + MARKS) == loads
    if loads:
        assert load_tokenizer(str(path)).vocab_size == 7
    else:
        with pytest.raises(LcftError, match=f"for a run of 4096 N .*lcft allows {GROWTH} a base"):
            load_tokenizer(str(path))


def test_replace_rules_are_bounded_from_the_file(tmp_path):
    """A Replace of a k-mer no probe holds is bounded by the file itself: RULE_LIMIT characters a base, not more."""
    for n, loads in ((7 * RULE_LIMIT, True), (7 * RULE_LIMIT + 1, False)):
        path = tokenizer_json(tmp_path / f"tok{n}", normalizers.Replace("GATTACA", "GATTACA" * (n // 7) + "A" * (n % 7)))
        if loads:  # RULE_LIMIT characters a base, on GATTACA only: no probe holds it
            assert load_tokenizer(str(path)).vocab_size == 7
        else:
            with pytest.raises(LcftError, match=f"can write {n / 7:,.4g} characters for one base"):
                load_tokenizer(str(path))


def test_prepare_train_and_eval_refuse_it_in_one_line(tmp_path):
    """The CLI's prepare refuses it before writing; windows whose kept tokenizer.json is swapped for it are refused
    as train and eval open the tokenizer (to re-tokenize for --rc-augment, to spell windows)."""
    from typer.testing import CliRunner

    from lcft.cli.app import app

    bomb = tokenizer_json(tmp_path / "bomb", normalizers.Replace("N", "N" * 1000))
    with pytest.raises(LcftError, match="enlarges DNA"):  # first, as prepare would fill memory cutting with it
        load_tokenizer(str(bomb))
    r = CliRunner().invoke(app, ["prepare", "windows", "--fasta", str(sample_fasta()), "--out", str(tmp_path / "o"),
                                 "--train", "chr2", "--eval", "chr22", "--tokenizer", str(bomb)])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "enlarges DNA" in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    plain = tokenizer_json(tmp_path / "plain", normalizers.Replace("R", "N"))
    prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "w"), length=1024, train=("chr2",),
                    eval=("chr22",), tokenizer=str(plain))
    kept = tmp_path / "w" / json.loads((tmp_path / "w" / "manifest.json").read_text())["tokenizer"].get("file", "tokenizer.json")
    kept.write_text(bomb.read_text())
    with pytest.raises(LcftError, match="enlarges DNA"):
        open_windows(str(tmp_path / "w"), "train").tokenizer  # noqa: B018


def test_a_file_the_library_does_not_read_is_told_why(tmp_path):
    """A normalizer of a kind the library does not know: the library's own reason, not a probe's failure."""
    path = tokenizer_json(tmp_path / "tok", normalizers.Replace("N", "A"))
    data = json.loads(path.read_text())
    data["normalizer"] = {"type": "FutureNorm"}
    path.write_text(json.dumps(data))
    with pytest.raises(LcftError, match=r"is not a tokenizers tokenizer.json \(data did not match any variant") as e:
        load_tokenizer(str(path))
    assert "\n" not in str(e.value) and "probe" not in str(e.value)


def test_a_file_the_library_panics_on_is_one_line(tmp_path, capfd):
    """A BPE whose merges lack its continuing_subword_prefix: the library panics building the model (a Rust panic,
    a BaseException; shown with `tokenizers` itself first); lcft's one line, and no panic report on stderr."""
    tk = Tokenizer(models.BPE(vocab={"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": 4, "N": 5, "AC": 6}, merges=[("A", "C")],
                              unk_token="<unk>"))
    data = json.loads(tk.to_str())
    data["model"]["continuing_subword_prefix"] = "##"
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(BaseException, match="slice index") as raw:
        Tokenizer.from_str(json.dumps(data))
    assert not isinstance(raw.value, Exception)
    capfd.readouterr()
    with pytest.raises(LcftError, match=r"is not a tokenizers tokenizer.json \(slice index") as e:
        load_tokenizer(str(tmp_path))
    assert "\n" not in str(e.value) and "panicked" not in capfd.readouterr().err


def test_regex_replaces_of_one_letter_each_are_not_counted_as_matching_nothing(tmp_path):
    """Seven Replaces of a character class by N write one character a base, whatever the bases (the library's
    own answer below); a regex that may match nothing (here before every character) is counted as such."""
    norm = normalizers.Sequence([normalizers.Replace(Regex("[RYKM]"), "N")] * 7)
    path = tokenizer_json(tmp_path / "classes", norm)
    assert written(path, "ARYKMT") == 6
    load_tokenizer(str(path))
    empty = normalizers.Replace(Regex("x*"), "N" * 40)
    assert len(empty.normalize_str("A")) == 81  # before the character and after it: 1 + 2 * 40 for one base
    path = tokenizer_json(tmp_path / "empty", normalizers.Sequence([empty] * 2))
    assert written(path, "A") == 3361 > GROWTH + MARKS  # it does write before every character
    with pytest.raises(LcftError, match="6,561 characters for one base"):  # 81 ** 2
        load_tokenizer(str(path))
