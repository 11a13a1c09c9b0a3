"""Genome data: FASTA reading, tokenization, fixed-length windows, shards and dataset readers.

Names are resolved lazily so that importing one module of the package (its config, say) does not import
torch and the rest of it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "sample_fasta": "lcft.genomics.fasta",
    "PrepareConfig": "lcft.genomics.prepare",
    "prepare_windows": "lcft.genomics.prepare",
    "read_manifest": "lcft.genomics.shards",
    "verify_windows": "lcft.genomics.shards",
    "decode": "lcft.genomics.tokenizer",
    "encode": "lcft.genomics.tokenizer",
    "WindowSet": "lcft.genomics.window_set",
    "open_windows": "lcft.genomics.window_set",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lcft.genomics' has no attribute {name!r}")
