"""Genome data: FASTA reading, tokenization, fixed-length windows, shards and dataset readers.

Names resolve lazily (lcft.lazy).
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

_EXPORTS = {
    "sample_fasta": "lcft.genomics.fasta",
    "PrepareConfig": "lcft.genomics.prepare_config",
    "prepare_windows": "lcft.genomics.prepare",
    "read_manifest": "lcft.genomics.shards",
    "verify_windows": "lcft.genomics.shards",
    "decode": "lcft.genomics.tokenizer",
    "encode": "lcft.genomics.tokenizer",
    "WindowSet": "lcft.genomics.window_set",
    "open_windows": "lcft.genomics.window_set",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
