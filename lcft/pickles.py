"""Reading a pickle we are handed without running it: one restricted unpickler, over bytes already in memory,
whose globals are only those its caller admits (DCP's `.metadata`, a pytorch_model.bin's data.pkl)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

from lcft.errors import shown

Resolve = Callable[[str, str], Any]  # (module, name) -> the object to use for it, or None to refuse it


class RestrictedUnpickler(pickle._Unpickler):
    """pickle's pure-Python unpickler, whose memo is a dict: the C one sizes an array by the largest memo index a
    pickle names (11 bytes asking for index 10^9 took 15 GiB). It reads from bytes in memory, so a length a
    pickle declares is bounded by what is there. A global resolves only through `resolve`; anything else, and
    every persistent id unless a subclass reads them, is an UnpicklingError at its first reference."""

    def __init__(self, data: bytes, resolve: Resolve):
        super().__init__(io.BytesIO(data))
        self._resolve = resolve

    def find_class(self, module: str, name: str) -> Any:
        found = self._resolve(module, name) if type(module) is str and type(name) is str else None
        if found is None:
            raise pickle.UnpicklingError(f"refused global {shown(f'{module}.{name}')}")
        return found
