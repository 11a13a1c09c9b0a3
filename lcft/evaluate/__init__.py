"""Evaluation: held-out loss by position for several checkpoints side by side (`lcft eval`).

Names are resolved lazily so the CLI can read EvalConfig without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalConfig": "lcft.evaluate.config",
    "evaluate": "lcft.evaluate.runner",
    "token_losses": "lcft.evaluate.losses",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lcft.evaluate' has no attribute {name!r}")
