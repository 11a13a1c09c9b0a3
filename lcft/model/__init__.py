"""The Llama-style decoder and its HF families as flags (Mistral, Qwen2, Qwen3, Mixtral); single-process,
parallelism is applied from outside by lcft.parallel. Model folders are read and written by lcft.checkpoint.

Names are resolved lazily so that importing one module of the package (its config, say) does not import
torch and the rest of it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AttentionConfig": "lcft.model.config",
    "LlamaConfig": "lcft.model.config",
    "Block": "lcft.model.llama",
    "Llama": "lcft.model.llama",
    "PRESETS": "lcft.model.presets",
    "preset": "lcft.model.presets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lcft.model' has no attribute {name!r}")
