"""Genome data: FASTA reading, tokenization, fixed-length windows, shards and dataset readers."""

from lcft.genomics.fasta import sample_fasta
from lcft.genomics.prepare import PrepareConfig, prepare_windows
from lcft.genomics.shards import read_manifest, verify_windows
from lcft.genomics.tokenizer import decode, encode
from lcft.genomics.window_set import WindowSet, open_windows

__all__ = [
    "PrepareConfig",
    "WindowSet",
    "decode",
    "encode",
    "open_windows",
    "prepare_windows",
    "read_manifest",
    "sample_fasta",
    "verify_windows",
]
