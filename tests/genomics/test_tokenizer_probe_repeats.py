"""A tokenizer.json whose regex backtracks on short tandem repeats ((GA)n and its kind) is refused in one line as it
is loaded, before prepare writes anything; a Rust panic inside `tokenizers` reaches stderr as lcft's one line only,
and only short calls hold stderr for it. Each pattern is shown to panic or crawl with `tokenizers` itself first."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from lcft.errors import LcftError
from lcft.genomics.kmer_tokenizer import builtin_kmer_vocab
from lcft.genomics.library_calls import guarded
from lcft.genomics.model_tokenizer import JsonTokenizer, tokenizer_from_json_text
from lcft.genomics.tokenizer_probe import REPEAT_LENGTHS, REPEATS
from tests.genomics.conftest import write_fasta

SINGLE = {"<unk>": 0, "A": 1, "C": 2, "G": 3, "T": 4, "N": 5}
NESTED = r"(?:(?:GA|G|A)+)+T|."  # exponential on GA...GAC: the engine gives up past its retry limit (a panic)
ALTERNATION = r"(?:GA|G|A)+T|."  # as exponential, with no quantifier inside another
CUBIC = r"(?:GA)*(?:GA)*T|."  # polynomial: never past the retry limit, but minutes a block of (GA)n


def split_json(pattern: str, vocab: dict[str, int] | None = None) -> str:
    """A WordLevel tokenizer.json behind a Split of `pattern` (each match its own piece)."""
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                       "pre_tokenizer": {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
                                         "invert": False},
                       "post_processor": None, "decoder": None,
                       "model": {"type": "WordLevel", "vocab": vocab or SINGLE, "unk_token": "<unk>"}})


def cpu_to_encode(tk: Tokenizer, bases: str) -> float:
    t = time.process_time()
    tk.encode(bases, add_special_tokens=False)
    return time.process_time() - t


@pytest.mark.parametrize("pattern", [NESTED, ALTERNATION, CUBIC])
def test_a_regex_that_backtracks_on_a_repeat_is_refused_at_load(pattern):
    tk = Tokenizer.from_str(split_json(pattern))
    assert len(tk.encode("CCTTGCAC" * 10, add_special_tokens=False).ids) == 80  # an ordinary tokenizer elsewhere
    if pattern == CUBIC:  # the library's time: 4x the bases, far more than 4x the time
        assert cpu_to_encode(tk, "GA" * 512 + "C") > 16 * cpu_to_encode(tk, "GA" * 128 + "C")
        refusal = r"backtracks on pre_tokenizer.pattern .* µs a base; lcft allows 20\), so prepare would crawl"
    else:
        with pytest.raises(BaseException, match="retry-limit-in-match over"):  # pyo3's PanicException
            tk.encode("GA" * 30 + "C", add_special_tokens=False)
        refusal = r"the regex engine gives up on pre_tokenizer.pattern .* repeated to 256 bases then"
    t = time.monotonic()
    with pytest.raises(LcftError, match=refusal) as e:
        tokenizer_from_json_text(split_json(pattern), "tok")
    assert "\n" not in str(e.value) and time.monotonic() - t < 60


# each slow on repeats of one longer unit only, never on one of 1-3 bases
LONGER = {r"(?:GGAAT|GGA|AT)+C|.": ("GGAAT", "gives up on pre_tokenizer.pattern .* 'AATGG' repeated to 256 bases"),
          r"(?:ACGTTG|ACG|TTG)+C|.": ("ACGTTG", "gives up on .* 'ACGTTG' repeated to 256 bases then A"),
          r"(?:GGAAT)*(?:GGAAT)*C|.": ("GGAAT", r"backtracks on .* 'AATGG' repeated to 4096 bases then C \("),
          r"(?:CCCTAA)*(?:CCCTAA)*G|.": ("CCCTAA", r"backtracks on .* 'AACCCT' repeated to 4096 bases then G \(")}


@pytest.mark.parametrize("pattern", list(LONGER))
def test_a_regex_that_backtracks_on_a_longer_unit_only_is_refused(pattern):
    """Satellite III's GGAAT and the telomere's other strand (polynomial: only an array of kilobases is slow), any
    unit up to 6 bases (exponential: a short run panics); quick on every repeat of 1-3 bases at each phase."""
    unit, refusal = LONGER[pattern]
    tk = Tokenizer.from_str(split_json(pattern))
    for u in ("".join(p) for k in (1, 2, 3) for p in itertools.product("ACGT", repeat=k)):
        for n, b in itertools.product(REPEAT_LENGTHS, "ACGT"):
            assert cpu_to_encode(tk, (u * n)[:n - 1] + b) < 20e-6 * n + 0.05, (u, n, b)
    if "*" in pattern:  # the library's time: 4x the bases, far more than 4x the time
        assert cpu_to_encode(tk, unit * 800 + "A") > 16 * cpu_to_encode(tk, unit * 200 + "A")
    else:
        with pytest.raises(BaseException, match="retry-limit-in-match over"):
            tk.encode(unit * 40 + "A", add_special_tokens=False)
    with pytest.raises(LcftError, match=refusal) as e:
        tokenizer_from_json_text(split_json(pattern), "tok")
    assert "\n" not in str(e.value)


def test_every_unit_up_to_six_bases_is_probed():
    """Each repeat of 1-6 bases, at any phase, is probed under one of its rotations (4-6 bases: once, at 256 bases),
    each unit once: 4 + 6 + 20 + 60 + 204 + 670, the primitive necklaces of 4 letters (Moebius)."""
    at_short = [u for u, n, _ in REPEATS if n == REPEAT_LENGTHS[0]]
    assert len(at_short) == len(set(at_short))
    for k, count in zip(range(1, 7), (4, 6, 20, 60, 204, 670), strict=True):
        assert len([u for u in at_short if len(u) == k]) == count
        for s in map("".join, itertools.product("ACGT", repeat=k)):
            if all(s != s[:d] * (k // d) for d in range(1, k) if k % d == 0):
                assert any(s[i:] + s[:i] in at_short for i in range(k)), s


@pytest.mark.parametrize("pattern", [".{1,6}", "[ACGTN]{6}|[ACGTN]+|."])
def test_kmer_splits_pass_the_repeat_probes(pattern):
    """A 6-mer WordLevel behind a regex of its own (probed: not lcft's split) loads and reads 6-mers."""
    vocab = {t: i for i, t in enumerate(builtin_kmer_vocab(6))}
    tok = tokenizer_from_json_text(split_json(pattern, vocab), "kmer")
    assert [tok.vocab[i] for i in tok.tk.encode("GATTACAGATTAC", add_special_tokens=False).ids] == \
        ["GATTAC", "AGATTA", "C"]


def test_prepare_refuses_it_before_writing_with_one_line(tmp_path):
    """The CLI, in a child process as a user runs it (a panic's report goes to descriptor 2 itself), on a genome
    holding (GA)30 then C: one line on stderr, no Rust text, nothing written."""
    rng = np.random.default_rng(0)
    bases = ["".join(np.array(list("ACGT"))[rng.integers(0, 4, n)]) for n in (6000, 6000, 5000)]
    fasta = write_fasta(tmp_path / "g.fa", {"chrA": bases[0] + "GA" * 30 + "C" + bases[1], "chrB": bases[2]})
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(split_json(NESTED))
    env = {**os.environ, "RUST_BACKTRACE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "lcft", "prepare", "windows", "--fasta", str(fasta), "--out",
                        str(tmp_path / "o"), "--length", "1K", "--train", "chrA", "--eval", "chrB", "--tokenizer",
                        str(tmp_path / "tok")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert "gives up on pre_tokenizer.pattern" in r.stderr and "panicked" not in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_panic_is_one_line_and_other_output_still_shows(capfd):
    """`guarded` on a call that panics (a pipeline built here, never probed): the panic's message in lcft's one
    line, the hook's report off stderr; what a call writes to stderr otherwise is kept."""
    tk = Tokenizer.from_str(split_json(NESTED))
    with pytest.raises(LcftError, match=r"failed on 'GA...' \(Onig: Regex search error: retry-limit-in-match over\)"):
        guarded(lambda: tk.encode("GA" * 30 + "C", add_special_tokens=False), "tok", "'GA...'")
    assert "panicked" not in capfd.readouterr().err
    got = guarded(lambda: (os.write(2, b"a warning\n"), tk.encode("CTGC", add_special_tokens=False))[1], "tok")
    assert len(got.ids) == 4 and capfd.readouterr().err == "a warning\n"


class _Watched:
    """A `tokenizers` Tokenizer whose encode_batch first writes a frame to descriptor 2 and notes what the capture
    holds by then (as a progress bar's thread would write mid-call)."""

    def __init__(self, tk: Tokenizer, capfd) -> None:
        self.tk, self.capfd, self.seen = tk, capfd, []

    def encode_batch(self, *args, **kwargs):
        os.write(2, b"frame\n")
        self.seen.append(self.capfd.readouterr().err)
        return self.tk.encode_batch(*args, **kwargs)


def test_encode_chunk_writes_to_stderr_as_it_goes(capfd):
    """Encoding bases (prepare's long call, beside its progress bar) leaves descriptor 2 alone: a write during the
    call is on stderr at once, not after it (nor dropped, nor a crash report lost); the ids are the library's."""
    tok = tokenizer_from_json_text(split_json(r"[ACGT]{1,3}|.", {**SINGLE, "GAT": 6, "TAC": 7}), "tok")
    assert isinstance(tok, JsonTokenizer)
    capfd.readouterr()
    tok.tk = watched = _Watched(tok.tk, capfd)
    upper = np.frombuffer(b"GATTACA", np.uint8)
    ids, counts = tok.encode_chunk(upper, np.array([0, 7]))
    assert watched.seen == ["frame\n"] and capfd.readouterr().err == ""
    assert ids.tolist() == watched.tk.encode("GATTACA", add_special_tokens=False).ids == [6, 7, 1] and \
        counts.tolist() == [3, 3, 1]


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _stderr_id() -> tuple[int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino


def test_an_interrupt_just_after_stderr_moves_puts_it_back(monkeypatch):
    """A KeyboardInterrupt arriving as descriptor 2 has just been pointed at the held file (a signal handler runs
    between bytecodes) still puts stderr back, and leaves no descriptor open."""
    tk = Tokenizer.from_str(split_json(NESTED))
    real, before, opened, keep = os.dup2, _stderr_id(), _open_descriptors(), os.dup(2)
    moves: list[int] = []

    def dup2_then_interrupted(fd: int, fd2: int, inheritable: bool = True) -> int:
        got = real(fd, fd2, inheritable)
        moves.append(fd2)
        if moves == [2]:  # the first move of stderr, the held file's way
            raise KeyboardInterrupt
        return got

    try:
        with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
            m.setattr(os, "dup2", dup2_then_interrupted)
            guarded(lambda: tk.encode("CTGC", add_special_tokens=False), "tok")
        after = _stderr_id()
    finally:  # the test's own stderr back whatever happened
        real(keep, 2)
        os.close(keep)
    assert after == before and _open_descriptors() == opened


def test_no_room_to_hold_the_report_runs_the_call_as_it_is(monkeypatch, capfd):
    """Where the held file cannot be made (no room in the temporary folder) the call runs with stderr as it is,
    and no descriptor is left open."""
    tk = Tokenizer.from_str(split_json(NESTED))

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    opened = _open_descriptors()
    with monkeypatch.context() as m:
        m.setattr(tempfile, "TemporaryFile", no_room)
        got = guarded(lambda: (os.write(2, b"a warning\n"), tk.encode("CTGC", add_special_tokens=False))[1], "tok")
    assert len(got.ids) == 4 and capfd.readouterr().err == "a warning\n" and _open_descriptors() == opened
