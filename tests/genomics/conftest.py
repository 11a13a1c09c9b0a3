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
