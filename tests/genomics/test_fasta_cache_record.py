"""A cache copy changed after it was made (its bases rewritten, the same size and time; cut short; left without
its record) is made again before it is read: the windows are those of a clean run, as Biopython reads the FASTA."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from lcft.genomics import prepare_windows
from lcft.genomics.fasta import FastaFile
from lcft.genomics.fasta_cache import cache_dir
from tests.genomics.conftest import bio_records, random_genome, write_fasta
from tests.unprivileged import unprivileged

RECS = {"a": random_genome(11, 12_000), "b": random_genome(12, 7_000)}


def _fasta(tmp_path: Path, kind: str) -> Path:
    """A FASTA read from a copy in the cache: a plain gzip (decompressed copy) or CR-only line ends (normalized)."""
    if kind == "gzip":
        gz = tmp_path / "g.fa.gz"
        gz.write_bytes(gzip.compress(write_fasta(tmp_path / "g.fa", RECS).read_bytes()))
        return gz
    return write_fasta(tmp_path / "mac.fa", RECS, eol="\r")


def _windows(fasta: Path, out: Path) -> bytes:
    prepare_windows(fasta=str(fasta), out=str(out), length=1024, train=("a", "b"), eval=())
    return (out / "train.bin").read_bytes()


def _all_t(copy: Path) -> None:
    """Every base of the copy made T, its size and modification time kept (as `touch -r` would)."""
    st = copy.stat()
    lines = copy.read_bytes().split(b"\n")
    copy.write_bytes(b"\n".join(ln if ln.startswith(b">") else b"T" * len(ln) for ln in lines))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert copy.stat().st_size == st.st_size


def _copy(fasta: Path) -> Path:
    with FastaFile(fasta) as f:
        assert f.readable.is_relative_to(cache_dir())
        return f.readable


@pytest.mark.parametrize("kind", ["gzip", "cr"])
def test_a_copy_rewritten_in_the_cache_is_made_again(tmp_path, kind, capsys):
    """Oracle: Biopython's reading of the FASTA itself; and the windows of the run before the copy was changed."""
    fasta = _fasta(tmp_path, kind)
    clean = _windows(fasta, tmp_path / "clean")
    copy = _copy(fasta)
    made = copy.read_bytes()
    _all_t(copy)
    capsys.readouterr()
    again = _windows(fasta, tmp_path / "again")
    assert again == clean and len(np.unique(np.frombuffer(again, np.uint8))) > 2
    note = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert note == [f"note: the cache's copy {copy} is not as it was made (its size or sha256 differs from "
                    f"{copy.name}.sum): making it again"]
    record = json.loads(copy.with_name(copy.name + ".sum").read_text())
    assert copy.read_bytes() == made and record == {"bytes": len(made), "sha256": hashlib.sha256(made).hexdigest()}
    with FastaFile(fasta) as f:
        assert f.readable == copy
        got = {n: f.read_raw(n, 0, f.length(n)).replace(b"\n", b"").decode() for n in f.names}
    assert got == bio_records(fasta if kind == "gzip" else write_fasta(tmp_path / "lf.fa", RECS)) == RECS


@pytest.mark.parametrize("damage", ["cut short", "no record", "record not JSON", "copy a link"])
def test_a_copy_without_a_matching_record_is_made_again(tmp_path, damage, capsys):
    fasta = _fasta(tmp_path, "gzip")
    copy = _copy(fasta)
    made = copy.read_bytes()
    record = copy.with_name(copy.name + ".sum")
    if damage == "cut short":
        copy.write_bytes(made[: len(made) // 2])
    elif damage == "no record":  # a copy an earlier lcft made
        record.unlink()
    elif damage == "record not JSON":
        record.write_bytes(b"\0" * 4096)
    else:  # a link to a file with the copy's bytes but for one base
        other = tmp_path / "other.fa"
        other.write_bytes(made.replace(b"A", b"C", 1))
        copy.unlink()
        copy.symlink_to(other)
    capsys.readouterr()
    assert _copy(fasta) == copy and not copy.is_symlink() and copy.read_bytes() == made
    assert json.loads(record.read_text())["sha256"] == hashlib.sha256(made).hexdigest()
    err = capsys.readouterr().err
    assert ("making it again" in err) == (damage == "cut short"), err


READ = """
import sys
from lcft.genomics.fasta import FastaFile
with FastaFile(sys.argv[1]) as f:
    print(f.readable, f.read_raw("a", 0, 8).decode())
"""


def test_a_copy_this_user_cannot_read_is_made_again(tmp_path):
    """A copy of another owner's mode (0 here: unreadable without root's override) in a cache this user may write:
    its check raised PermissionError, a traceback; now it is made again."""
    fasta = _fasta(tmp_path, "gzip")
    copy = _copy(fasta)
    made = copy.read_bytes()
    copy.chmod(0)
    r = unprivileged([sys.executable, "-c", READ, str(fasta)])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.split() == [str(copy), RECS["a"][:8]]
    assert copy.read_bytes() == made
