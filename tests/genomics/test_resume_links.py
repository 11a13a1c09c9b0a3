"""`lcft prepare windows` resuming a `.partial` where something other than the run's own files was left (a link
to a file outside, a hard link, a link in place of the folder): the outside file is never read through, cut or
written; the command stops with one line and the folder is left as it was."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import lcft.genomics.prepare as P
from lcft.errors import RESUME
from lcft.genomics import prepare_windows
from lcft.genomics.shards import HashedFile
from tests.genomics.conftest import random_genome, write_fasta
from tests.one_line import cli_fails

L = 2048
VICTIM = b"precious " * 100_000  # longer than any file of the run: a cut shows


@pytest.fixture(scope="module")
def genome(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("genome")
    return write_fasta(d / "two.fa", {"c1": random_genome(1, 40 * L), "c2": random_genome(2, 30 * L)})


def args(genome: Path, out: Path, tokenizer: str) -> list[str]:
    return ["prepare", "windows", "--fasta", str(genome), "--out", str(out), "--length", str(L), "--train", "c1",
            "--eval", "c2", "--tokenizer", tokenizer]


def stopped_run(genome: Path, out: Path, tokenizer: str, monkeypatch) -> Path:
    """A run stopped by a full disk after its first chromosome: its `.partial` kept to resume."""
    real, calls = P._cut_one, []

    def full_on_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(P, "_cut_one", full_on_second)
    with pytest.raises(Exception, match=RESUME):
        prepare_windows(fasta=str(genome), out=str(out), length=L, train=("c1",), eval=("c2",), tokenizer=tokenizer)
    monkeypatch.setattr(P, "_cut_one", real)
    return out / ".partial"


def listing(folder: Path) -> dict[str, tuple[bool, int]]:
    return {p.name: (p.is_symlink(), p.lstat().st_size) for p in folder.iterdir()}


@pytest.mark.parametrize(("name", "tokenizer"), [
    ("train.bin", "char"),  # reopened to resume: was cut to the kept size through the link
    ("eval.bin", "char"),  # nothing kept yet: was opened "wb" through the link, emptying it
    ("tokenizer.json", "kmer:6"),  # written when the run completes: was written through the link
])
def test_a_link_in_partial_is_refused_and_its_target_untouched(genome, tmp_path, monkeypatch, name, tokenizer):
    out = tmp_path / "out"
    partial = stopped_run(genome, out, tokenizer, monkeypatch)
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    (partial / name).unlink(missing_ok=True)
    (partial / name).symlink_to(victim)
    before = listing(partial)
    cli_fails(args(genome, out, tokenizer), str(partial / name), "not a file prepare wrote")
    assert victim.read_bytes() == VICTIM
    assert listing(partial) == before  # refused before anything was resumed or removed


def test_partial_as_a_link_to_a_folder_is_refused(genome, tmp_path, monkeypatch):
    """`.partial` itself a link: a fresh start would have emptied the folder it points to."""
    out = tmp_path / "out"
    partial = stopped_run(genome, out, "char", monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    partial.rename(elsewhere)
    (elsewhere / "state.json").write_text("{}")  # not of these options: the old code started over, clearing it
    (elsewhere / "mine.txt").write_bytes(VICTIM)
    partial.symlink_to(elsewhere)
    cli_fails(args(genome, out, "char"), str(partial), "not a folder prepare made")
    assert (elsewhere / "mine.txt").read_bytes() == VICTIM and (elsewhere / "state.json").read_text() == "{}"


def test_a_resume_with_the_planted_link_removed_completes(genome, tmp_path, monkeypatch):
    """The way out the message gives: remove the entry, re-run; the windows are those of an uninterrupted run."""
    out, clean = tmp_path / "out", tmp_path / "clean"
    partial = stopped_run(genome, out, "char", monkeypatch)
    (partial / "train.bin").rename(tmp_path / "kept.bin")
    (partial / "train.bin").symlink_to(tmp_path / "kept.bin")
    cli_fails(args(genome, out, "char"), "train.bin")
    (partial / "train.bin").unlink()
    prepare_windows(fasta=str(genome), out=str(out), length=L, train=("c1",), eval=("c2",))
    prepare_windows(fasta=str(genome), out=str(clean), length=L, train=("c1",), eval=("c2",))
    for name in ("train.bin", "train.softmask.bin", "eval.bin", "manifest.json"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name


def test_hashed_file_checks_the_kept_bytes_before_cutting(tmp_path):
    """A hard link (a regular file sharing its bytes with one outside) whose prefix is not the recorded one is
    replaced, not cut; a link is replaced, never followed; a file of ours with the recorded prefix resumes."""
    victim, path = tmp_path / "victim", tmp_path / "train.bin"
    victim.write_bytes(VICTIM)
    ours = b"A" * 1000
    digest = hashlib.sha256(ours).hexdigest()
    for plant in (os.link, os.symlink):
        path.unlink(missing_ok=True)
        plant(victim, path)
        f = HashedFile(path, len(ours), digest)
        f.close()
        assert victim.read_bytes() == VICTIM and f.size == 0 and not path.is_symlink() and path.stat().st_size == 0
    path.write_bytes(ours + b"torn tail")
    f = HashedFile(path, len(ours), digest)
    f.append(b"B")
    f.hash.update(b"B")
    f.close()
    assert path.read_bytes() == ours + b"B" and f.hash.hexdigest() == hashlib.sha256(ours + b"B").hexdigest()
