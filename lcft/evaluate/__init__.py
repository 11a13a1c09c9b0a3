"""Evaluation: held-out loss by position for several checkpoints side by side (`lcft eval`).

Names are resolved lazily so the CLI can read EvalConfig without importing torch.
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

_EXPORTS = {
    "EvalConfig": "lcft.evaluate.config",
    "evaluate": "lcft.evaluate.runner",
    "token_losses": "lcft.evaluate.losses",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
