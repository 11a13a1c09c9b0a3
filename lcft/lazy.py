"""Lazy re-exports for a package's __init__: each name is imported from its module when first read, so importing
one module of the package (its config, say) imports neither torch nor the rest of the package."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module-level `__getattr__` for `exports` (name -> the module defining it). A name must not be
    one of the package's modules: importing that module sets the package's attribute of the name to the module."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
