"""Checkpoints of a run and model folders: reading and writing their stateful parts without running code from any
file (docs/design.md, Checkpoint component).

Names are resolved lazily so that importing the layout (lcft.checkpoint.layout) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load": "lcft.checkpoint.reader",
    "Loaded": "lcft.checkpoint.reader",
    "from_pretrained": "lcft.checkpoint.hf_folder",
    "save_pretrained": "lcft.checkpoint.hf_folder",
    "export_model": "lcft.checkpoint.export",
    "resolve_checkpoint": "lcft.checkpoint.layout",
    "resolve_resume": "lcft.checkpoint.layout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lcft.checkpoint' has no attribute {name!r}")
