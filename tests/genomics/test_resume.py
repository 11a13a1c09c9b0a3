"""Atomic and resumable writing: SIGKILL midway then re-run = byte-identical; no-op; option mismatch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lcft.errors import LcftError
from lcft.genomics import prepare_windows, verify_windows
from tests.genomics.conftest import random_genome, write_fasta

L = 8192
OUTPUTS = ("train.bin", "train.softmask.bin", "eval.bin", "eval.softmask.bin", "manifest.json")

# Runs prepare in a child process that SIGKILLs itself in the middle of chromosome k+1: after k
# per-chromosome checkpoints have been written and a few windows of the next one have hit the disk.
KILLER = textwrap.dedent("""
    import os, signal, sys
    import lcft.genomics.prepare as P
    from lcft.genomics.shards import SplitWriter
    k = int(sys.argv[3]); seen = {"ckpt": 0, "adds": 0}
    real_json, real_add = P.write_json_atomic, SplitWriter.add
    def json_hook(path, data, **kw):
        real_json(path, data, **kw)
        seen["ckpt"] += 1
    def add_hook(self, ids, soft):
        real_add(self, ids, soft)
        if seen["ckpt"] >= k:
            seen["adds"] += 1
            if seen["adds"] == 3:
                self.flush()  # make the torn chromosome visible on disk
                os.kill(os.getpid(), signal.SIGKILL)
    P.write_json_atomic, SplitWriter.add = json_hook, add_hook
    P.prepare_windows(fasta=sys.argv[1], out=sys.argv[2], length={L}, train=("c1", "c2", "c3", "c4"),
                      eval=("c5", "c6"), max_n_frac=0.3)
""").replace("{L}", str(L))


@pytest.fixture(scope="module")
def genome(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("genome")
    recs = {f"c{i}": random_genome(10 + i, 40 * L + 123 * i) for i in range(1, 7)}
    return write_fasta(d / "six.fa", recs)


def prep(genome, out, **kw):
    kw = {"length": L, "train": ("c1", "c2", "c3", "c4"), "eval": ("c5", "c6"), "max_n_frac": 0.3} | kw
    return prepare_windows(fasta=str(genome), out=str(out), **kw)


@pytest.mark.parametrize("k", [2, 5])  # killed inside train (3rd chromosome) or inside eval (6th)
def test_sigkill_midway_then_resume_is_byte_identical(genome, tmp_path, k):
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", KILLER, str(genome), str(out), str(k)], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()
    state = json.loads((out / ".partial" / "state.json").read_text())
    assert len(state["chroms"]) == k
    # hashed on a thread beside the first chromosome's cut, and recorded with its checkpoint: the resume matches
    assert state["options"]["fasta"]["sha256"] == hashlib.sha256(genome.read_bytes()).hexdigest()
    split = "train" if k < 4 else "eval"
    torn = (out / ".partial" / f"{split}.bin").stat().st_size
    assert torn > state["sizes"][split][0], "the killed run had written part of the next chromosome"
    assert not any((out / name).exists() for name in OUTPUTS), "nothing may appear before completion"

    prep(genome, out)
    prep(genome, tmp_path / "clean")
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
    assert not (out / ".partial").exists()
    verify_windows(out)


def test_torn_checkpoint_is_not_resumed(genome, tmp_path):
    """If the kept prefix does not hash to the checkpoint's digest (e.g. a machine crash lost data that
    the state already counted), the run starts over instead of building on it."""
    out = tmp_path / "torn"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", KILLER, str(genome), str(out), "2"], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL
    data = out / ".partial" / "train.bin"
    with open(data, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff")
    prep(genome, out)
    prep(genome, tmp_path / "clean")
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


def test_same_options_is_a_noop(genome, tmp_path, capsys):
    out = tmp_path / "o"
    m1 = prep(genome, out)
    stamps = {n: (out / n).stat().st_mtime_ns for n in OUTPUTS}
    m2 = prepare_windows(fasta=str(genome), out=str(out), length=L, train="c1,c2,c3,c4", eval="c5,c6",
                         max_n_frac=0.3, progress=True)
    assert m1 == m2
    assert {n: (out / n).stat().st_mtime_ns for n in OUTPUTS} == stamps
    assert "nothing to do" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "named"), [
    ({"length": 2 * L}, "length"), ({"stride": L // 2}, "stride"), ({"max_n_frac": 0.5}, "max_n_frac"),
    ({"eval": ("c6",)}, "eval"), ({"train": ("c1",)}, "train"),
])
def test_different_options_fail_naming_the_option(genome, tmp_path, change, named):
    out = tmp_path / "o"
    prep(genome, out)
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(LcftError, match=f"different {named} ") as e:
        prep(genome, out, **change)
    assert "--overwrite" in str(e.value)
    assert (out / "manifest.json").read_bytes() == before


def test_different_fasta_fails_and_overwrite_replaces(genome, tmp_path):
    out = tmp_path / "o"
    prep(genome, out)
    other = write_fasta(tmp_path / "other.fa", {f"c{i}": random_genome(99 + i, 20 * L) for i in range(1, 7)})
    with pytest.raises(LcftError, match="different fasta"):
        prep(other, out)
    m = prep(other, out, overwrite=True)
    assert m["source"]["path"] == str(other.resolve())
    verify_windows(out)


def test_partial_from_other_options_is_discarded(genome, tmp_path):
    """A .partial left by a run with other options is not resumed into this one."""
    out = tmp_path / "o"
    (out / ".partial").mkdir(parents=True)
    (out / ".partial" / "state.json").write_text(json.dumps({"options": {"length": 1}, "chroms": []}))
    (out / ".partial" / "train.bin").write_bytes(b"junk" * 100)
    prep(genome, out)
    prep(genome, tmp_path / "clean")
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


def test_stray_outputs_without_manifest_are_not_overwritten(genome, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "train.bin").write_bytes(b"precious")
    with pytest.raises(LcftError, match="train.bin but no complete manifest"):
        prep(genome, out)
    assert (out / "train.bin").read_bytes() == b"precious"


def test_crash_while_moving_outputs_into_place(genome, tmp_path, monkeypatch):
    """Killed between the renames of the final step: the re-run completes the move; the manifest comes last."""
    import lcft.genomics.prepare_folder as F

    real, moved = os.replace, []

    def crash_after_two(src, dst):
        if Path(src).parent.name == ".partial" and Path(src).name in OUTPUTS:
            if len(moved) == 2:
                raise KeyboardInterrupt  # stands in for a kill: nothing catches it
            moved.append(Path(src).name)
        real(src, dst)

    out = tmp_path / "o"
    monkeypatch.setattr(F.os, "replace", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        prep(genome, out)
    monkeypatch.setattr(F.os, "replace", real)
    assert not (out / "manifest.json").exists() and len(moved) == 2
    prep(genome, out)
    prep(genome, tmp_path / "clean")
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
    assert not (out / ".partial").exists()


def test_crash_while_removing_the_finished_partial_folder(genome, tmp_path, monkeypatch):
    """Killed while removing `.partial` after the manifest was moved into place: the folder is complete, and the
    re-run, a no-op, removes what is left of `.partial` (it had stayed for good)."""
    import lcft.genomics.prepare_folder as F

    real = shutil.rmtree

    def crash_after_one(path, *a, **kw):
        if Path(path).name == ".partial":
            (Path(path) / "state.json").unlink()  # part of it removed, then the kill
            raise KeyboardInterrupt
        real(path, *a, **kw)

    out = tmp_path / "o"
    monkeypatch.setattr(F.shutil, "rmtree", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        prep(genome, out)
    monkeypatch.setattr(F.shutil, "rmtree", real)
    assert (out / "manifest.json").is_file() and (out / ".partial").is_dir()
    stamps = {n: (out / n).stat().st_mtime_ns for n in OUTPUTS}
    prep(genome, out)
    assert not (out / ".partial").exists() and {n: (out / n).stat().st_mtime_ns for n in OUTPUTS} == stamps
    assert verify_windows(out)


def test_second_writer_into_the_same_folder_is_refused(genome, tmp_path):
    import fcntl

    out = tmp_path / "o"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running prepare holds
    try:
        with pytest.raises(LcftError, match="another `lcft prepare` is writing"):
            prep(genome, out)
    finally:
        os.close(fd)
    prep(genome, out)


def test_overwrite_into_a_folder_being_written_is_refused_before_deleting(genome, tmp_path, monkeypatch):
    """A second `prepare --overwrite` starts while the first is cutting (called from inside the first's window
    writer): refused by the lock, it deletes nothing; the first finishes complete and equal to a clean run."""
    from lcft.genomics.shards import SplitWriter

    out, real_add, seen = tmp_path / "o", SplitWriter.add, {"adds": 0, "refused": ""}

    def add_then_race(self, ids, soft):
        real_add(self, ids, soft)
        seen["adds"] += 1
        if seen["adds"] == 3:
            self.flush()
            with pytest.raises(LcftError) as e:
                prep(genome, out, overwrite=True)
            seen["refused"] = str(e.value)

    monkeypatch.setattr(SplitWriter, "add", add_then_race)
    prep(genome, out)
    monkeypatch.setattr(SplitWriter, "add", real_add)
    assert "another `lcft prepare` is writing" in seen["refused"]
    verify_windows(out)
    prep(genome, tmp_path / "clean")
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


def test_fasta_with_other_contents_at_the_same_size_is_not_a_noop(genome, tmp_path):
    """Soft mask removed in place: same size, same line layout, so the same .fai; the contents differ."""
    fasta = tmp_path / "g.fa"
    fasta.write_bytes(genome.read_bytes())
    out = tmp_path / "o"
    prep(fasta, out)
    before = (out / "manifest.json").read_bytes()
    fasta.write_bytes(b"\n".join(ln if ln.startswith(b">") else ln.upper() for ln in genome.read_bytes().split(b"\n")))
    assert fasta.stat().st_size == genome.stat().st_size
    with pytest.raises(LcftError, match=r"different fasta \(--fasta: was sha256 \w{12}, now sha256 \w{12}\)"):
        prep(fasta, out)
    assert (out / "manifest.json").read_bytes() == before
    m = prep(fasta, out, overwrite=True)
    assert m["source"]["sha256"] == hashlib.sha256(fasta.read_bytes()).hexdigest()
    verify_windows(out)


def unknown_letters(tmp_path: Path) -> Path:
    """One record with every 20th base a 'J' (no token in the char tokenizer): 5% unknown tokens."""
    seq = list(random_genome(7, 5 * L, n_runs=0))
    seq[::20] = "J" * len(seq[::20])
    return write_fasta(tmp_path / "j.fa", {"c1": "".join(seq), "c2": random_genome(8, 2 * L, n_runs=0)})


def test_stricter_max_oov_frac_on_a_prepared_folder_is_refused(tmp_path):
    fasta, out = unknown_letters(tmp_path), tmp_path / "o"
    kw = {"length": L, "train": ("c1",), "eval": ("c2",)}
    prepare_windows(fasta=str(fasta), out=str(out), max_oov_frac=1.0, **kw)
    with pytest.raises(LcftError, match=r"train: 2,048 of 40,960 tokens \(5.00%\).*--max-oov-frac 0.01"):
        prepare_windows(fasta=str(fasta), out=str(out), **kw)  # the default limit


def test_a_failed_overwrite_keeps_the_finished_windows(genome, tmp_path):
    """The replacement is refused only once cut (its unknown tokens): the folder still holds the old windows."""
    out = tmp_path / "o"
    prep(genome, out)
    before = {n: (out / n).read_bytes() for n in OUTPUTS}
    with pytest.raises(LcftError, match="max-oov-frac"):
        prepare_windows(fasta=str(unknown_letters(tmp_path)), out=str(out), length=L, train=("c1",), eval=("c2",),
                        overwrite=True)
    assert {n: (out / n).read_bytes() for n in OUTPUTS} == before
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, "prepare.toml"])
    verify_windows(out)


def test_overwrite_removes_the_outputs_the_new_run_does_not_make(tmp_path):
    """k-mer windows (ids, bases per token) replaced by char windows: no stale bases file is left."""
    fasta, out = unknown_letters(tmp_path), tmp_path / "o"
    kw = {"length": L // 4, "train": ("c2",), "eval": (), "max_oov_frac": 1.0}
    prepare_windows(fasta=str(fasta), out=str(out), tokenizer="kmer:3", **kw)
    assert (out / "train.bases.bin").exists()
    prepare_windows(fasta=str(fasta), out=str(out), overwrite=True, **kw)
    assert not (out / "train.bases.bin").exists() and not (out / "tokenizer.json").exists()
    verify_windows(out)


def test_a_killed_overwrite_resumes_with_or_without_the_flag(genome, tmp_path, monkeypatch):
    """Killed in its 3rd chromosome, an --overwrite with other options leaves the old windows and its .partial:
    the rerun (with --overwrite or without) cuts only the chromosomes not done, and ends equal to a clean run."""
    import lcft.genomics.prepare as P

    out, real, cut = tmp_path / "o", P._cut_one, []
    prep(genome, out)
    other = write_fasta(tmp_path / "other.fa", {f"c{i}": random_genome(99 + i, 20 * L) for i in range(1, 7)})

    def killed_in_third(fasta, split, chrom, *a):
        cut.append(chrom)
        if cut == ["c1", "c2", "c3"]:
            raise KeyboardInterrupt  # stands in for a kill: nothing catches it
        real(fasta, split, chrom, *a)

    monkeypatch.setattr(P, "_cut_one", killed_in_third)
    with pytest.raises(KeyboardInterrupt):
        prep(other, out, overwrite=True)
    assert (out / "manifest.json").is_file() and (out / ".partial" / "state.json").is_file()
    for overwrite in (False, True):
        case = tmp_path / f"again-{overwrite}"
        shutil.copytree(out, case)
        cut.clear()
        prep(other, case, overwrite=overwrite)
        assert cut == ["c3", "c4", "c5", "c6"]  # c1 and c2 were done
    prep(other, tmp_path / "clean")
    for name in OUTPUTS:
        for overwrite in (False, True):
            assert (tmp_path / f"again-{overwrite}" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


def test_a_folder_recorded_with_the_index_md5_is_still_current(genome, tmp_path):
    """Folders written before the FASTA's sha256 was recorded name it by size and .fai md5: still a no-op."""
    out = tmp_path / "o"
    prep(genome, out)
    m = json.loads((out / "manifest.json").read_text())
    fai = Path(str(genome) + ".fai")
    m["options"]["fasta"] = {"size": genome.stat().st_size, "fai_md5": hashlib.md5(fai.read_bytes()).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(m))
    stamps = {n: (out / n).stat().st_mtime_ns for n in OUTPUTS}
    assert prep(genome, out) == m
    assert {n: (out / n).stat().st_mtime_ns for n in OUTPUTS} == stamps
    m["options"]["fasta"]["fai_md5"] = "0" * 32
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LcftError, match="different fasta"):
        prep(genome, out)


STATE_DAMAGE = {  # each: the checkpoint of a killed run, of these options, not what prepare writes
    "sizes-text": lambda s: s["sizes"].__setitem__("train", "many"),  # a TypeError reopening the writers
    "no-chroms": lambda s: s.pop("chroms"),  # a KeyError
    "chrom-entry": lambda s: s["chroms"].__setitem__(0, 5),
    "finished-text": lambda s: s.__setitem__("finished", "no"),  # 'no' is true: the torn run taken as finished
    "letters-list": lambda s: s.__setitem__("oov_letters", {"train": ["N"]}),
    "letters-text": lambda s: s.__setitem__("oov_letters", {"train": {"N": "many"}}),  # a TypeError adding counts
    "record-lost": lambda s: s["records"].pop(),  # a manifest of one window fewer than the shards hold
    "record-shape": lambda s: s["records"][0].pop("end"),  # a KeyError building the manifest
    "windows-text": lambda s: s["chroms"][0].__setitem__("windows", "2"),  # a TypeError summing windows
    "deep": lambda s: None,  # written below as text: 5,000 nested lists, json's RecursionError
}


@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_a_checkpoint_not_as_prepare_writes_it_starts_over(genome, tmp_path, damage):
    """The run's own .partial/state.json, damaged but still of these options: the run starts over and ends
    byte-identical to an uninterrupted one (a traceback before, or a torn run taken as finished)."""
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", KILLER, str(genome), str(out), "2"], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()
    path = out / ".partial" / "state.json"
    state = json.loads(path.read_text())
    STATE_DAMAGE[damage](state)
    path.write_text(json.dumps(state) if damage != "deep" else path.read_text().replace(
        '"records": [', '"records": ' + "[" * 5000 + "]" * 5000 + ', "x": [', 1))
    prep(genome, out)
    prep(genome, tmp_path / "clean")
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name
