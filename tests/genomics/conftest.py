"""Fixtures for the data-stage tests: a private cache folder, Biopython oracles for the shared genomes."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from Bio import SeqIO


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Decompressed FASTA copies and indexes of read-only inputs go to a per-session temp folder."""
    monkeypatch.setenv("LCFT_CACHE", str(tmp_path_factory.getbasetemp() / "lcft-cache"))


def bio_records(path: Path) -> dict[str, str]:
    """Biopython's reading of a FASTA (plain or gzip): {record id: sequence as in the file, case kept}."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return {r.id: str(r.seq) for r in SeqIO.parse(fh, "fasta")}


def write_fasta(path: Path, records: dict[str, str], width: int = 60, eol: str = "\n") -> Path:
    """Write records as FASTA with `width` bases per line and the given line ending."""
    with open(path, "w", newline="") as fh:
        for name, seq in records.items():
            fh.write(f">{name}{eol}")
            for i in range(0, len(seq), width):
                fh.write(seq[i : i + width] + eol)
    return path


def random_genome(seed: int, length: int, softmask: bool = True, n_runs: int = 2) -> str:
    """A random soft-masked sequence with a few N runs (numpy-generated, so large ones are cheap)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    seq = np.frombuffer(b"ACGT", dtype=np.uint8)[rng.integers(0, 4, length)].copy()
    if softmask:
        for s in rng.integers(0, length, max(1, length // 5000)):
            seq[s : s + int(rng.integers(100, 3000))] |= 0x20  # lower case = repeat
    for s in rng.integers(0, length, n_runs):
        seq[s : s + int(rng.integers(1000, length // 8 + 1001))] = ord("N")
    return seq.tobytes().decode()
