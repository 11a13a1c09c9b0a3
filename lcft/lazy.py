"""Lazy imports for the package: re-exports for a package's __init__, each name imported from its module when first
read (importing one module of the package, its config say, imports neither torch nor the rest of the package), and
type checks against a class whose module is imported only by the code paths that make its instances."""

from __future__ import annotations

import importlib
import sys
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


def is_loaded_instance(obj: object, module: str, name: str) -> bool:
    """isinstance(obj, module.name) without importing `module`: before the module is imported no instance of its
    class can exist (torch.distributed.tensor's DTensor: imported, with sympy, only where FSDP or DCP runs)."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(obj, getattr(loaded, name))
