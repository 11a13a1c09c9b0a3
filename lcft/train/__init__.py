"""`lcft train`: Accelerate-driven, resumable training of the decoder on prepared genome windows.

Names resolve lazily (lcft.lazy).
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

_EXPORTS = {
    "latest_checkpoint": "lcft.checkpoint.layout",
    "TrainConfig": "lcft.train.config",
    "TrainHooks": "lcft.train.trainer",
    "train": "lcft.train.trainer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
