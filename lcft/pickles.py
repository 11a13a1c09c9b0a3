"""Reading a pickle we are handed without running it: one restricted unpickler, over bytes already in memory,
whose globals are only those its caller admits (DCP's `.metadata`, a pytorch_model.bin's data.pkl)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
from collections.abc import Callable, Iterator
from typing import Any

from lcft.errors import LcftError, shown

Resolve = Callable[[str, str], Any]  # (module, name) -> the object to use for it, or None to refuse it


class RestrictedUnpickler(pickle._Unpickler):
    """pickle's pure-Python unpickler, whose memo is a dict: the C one sizes an array by the largest memo index a
    pickle names (11 bytes asking for index 10^9 took 15 GiB). It reads from bytes in memory, so a length a
    pickle declares is bounded by what is there: every opcode reads its bytes before building from them, once
    BYTEARRAY8 does too (pickle's own allocates the declared length first). A global resolves only through
    `resolve`; anything else, and every persistent id unless a subclass reads them, is an UnpicklingError at its
    first reference."""

    def __init__(self, data: bytes, resolve: Resolve):
        super().__init__(io.BytesIO(data))
        self._resolve = resolve

    def find_class(self, module: str, name: str) -> Any:
        found = self._resolve(module, name) if type(module) is str and type(name) is str else None
        if found is None:
            raise pickle.UnpicklingError(f"refused global {shown(f'{module}.{name}')}")
        return found

    def _load_bytearray8(self) -> None:
        (n,) = struct.unpack("<Q", self.read(8))
        data = self.read(n)  # in-memory reads stop at the end of what is there
        if len(data) != n:
            raise pickle.UnpicklingError(f"a bytearray of {n} bytes runs past the end of the pickle")
        self.append(bytearray(data))

    dispatch = {**pickle._Unpickler.dispatch, pickle.BYTEARRAY8[0]: _load_bytearray8}


@contextlib.contextmanager
def reading(path: str | os.PathLike, refused: Callable[[str], LcftError]) -> Iterator[None]:
    """Whatever reading the pickled file `path` raises, as one line: an OSError says it cannot be read, an
    UnpicklingError (a refused global, a check of the caller's) is `refused(why)`, anything else a torn file
    raises (EOFError, ValueError, struct.error, BadZipFile...) is `refused("corrupt (...)")`."""
    try:
        yield
    except LcftError:
        raise
    except OSError as e:
        raise LcftError(f"{path}: cannot read ({e.strerror or e})") from None
    except pickle.UnpicklingError as e:
        raise refused(str(e)) from None
    except Exception as e:  # a torn file: what the parser of its bytes happens to raise
        raise refused(f"corrupt ({type(e).__name__})") from None
