"""Recipes: end-to-end runs that chain prepare, train and eval (the demo)."""

from __future__ import annotations

from typing import Any


def prepare_demo_windows(**options: Any) -> dict[str, Any]:
    """prepare_windows for a demo stage: windows of other options in the stage's folder are said to be the
    demo's own, with the advice that works here (the demo has no --overwrite)."""
    from lcft.errors import LcftError
    from lcft.genomics import prepare_windows
    from lcft.genomics.prepare_folder import PreparedOtherwise

    try:
        return prepare_windows(**options)
    except PreparedOtherwise as e:
        raise LcftError(f"{e.held}, by an earlier demo; choose another --out, or delete {options['out']} (and "
                        "the runs made from it) to start over") from None
