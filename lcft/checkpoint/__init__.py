"""Checkpoints of a run and model folders: reading and writing their stateful parts without running code from any
file (docs/design.md, Checkpoint component).

Names are resolved lazily so that importing the layout (lcft.checkpoint.layout) does not import torch.
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
