"""`lcft train`: Accelerate-driven, resumable training of the decoder on prepared genome windows.

Names are resolved lazily so that importing one module of the package (its config, say) does not import
torch and the rest of it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "latest_checkpoint": "lcft.checkpoint.layout",
    "TrainConfig": "lcft.train.config",
    "TrainHooks": "lcft.train.trainer",
    "train": "lcft.train.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lcft.train' has no attribute {name!r}")
