"""The Llama-style decoder and its HF families as flags (Mistral, Qwen2, Qwen3, Mixtral); single-process,
parallelism is applied from outside by lcft.parallel. Model folders are read and written by lcft.checkpoint.

Names resolve lazily (lcft.lazy).
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

_EXPORTS = {
    "AttentionConfig": "lcft.model.config",
    "LlamaConfig": "lcft.model.config",
    "Block": "lcft.model.llama",
    "Llama": "lcft.model.llama",
    "PRESETS": "lcft.model.presets",
    "preset": "lcft.model.presets",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
