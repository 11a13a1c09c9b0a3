"""Reading a pickle we are handed without running it: one restricted unpickler, over bytes already in memory,
whose globals are only those its caller admits (DCP's `.metadata`, a pytorch_model.bin's data.pkl)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
import sys
from collections.abc import Callable, Iterator
from types import TracebackType
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

    def __init__(self, data: bytes, resolve: Resolve) -> None:
        super().__init__(io.BytesIO(data))
        self._resolve = resolve

    def find_class(self, module: str, name: str) -> Any:
        found = self._resolve(module, name) if type(module) is str and type(name) is str else None
        if found is None:
            raise pickle.UnpicklingError(f"refused global {shown(f'{module}.{name}')}")
        return found

    def _load_bytearray8(self) -> None:
        head = self.read(8)
        if len(head) != 8:  # struct.error would be raised here, in lcft's frame, and read as a bug of ours
            raise pickle.UnpicklingError("a bytearray's length runs past the end of the pickle")
        (n,) = struct.unpack("<Q", head)
        data = self.read(n)  # in-memory reads stop at the end of what is there
        if len(data) != n:
            raise pickle.UnpicklingError(f"a bytearray of {n} bytes runs past the end of the pickle")
        self.append(bytearray(data))

    dispatch = {**pickle._Unpickler.dispatch, pickle.BYTEARRAY8[0]: _load_bytearray8}


# The packages whose code parses a handed file's bytes: the standard library's pickle and zipfile, and what a
# pickle may build with (pathlib, collections, torch's dtypes and sizes, DCP's metadata classes).
_PARSERS = sys.stdlib_module_names | {"torch"}


@contextlib.contextmanager
def reading(path: str | os.PathLike, refused: Callable[[str], LcftError]) -> Iterator[None]:
    """Whatever reading the pickled file `path` raises, as one line: an OSError says it cannot be read, an
    UnpicklingError (a refused global, a check of the caller's) is `refused(why)`, anything else the parsers of
    its bytes raise for a torn or crafted file (EOFError, struct.error, BadZipFile, or the TypeError of a call
    with the wrong arguments...) is `refused("corrupt (...)")`. What lcft's own code raises is a bug of ours and
    keeps its traceback: lcft checks what it reads of a file and says why, as an UnpicklingError or LcftError."""
    try:
        yield
    except LcftError:
        raise
    except OSError as e:
        raise LcftError(f"{path}: cannot read ({e.strerror or e})") from None
    except pickle.UnpicklingError as e:
        raise refused(str(e)) from None
    except Exception as e:
        if not _raised_by_parser(e.__traceback__):
            raise
        kind = type(e).__name__ if type(e).__module__ == "builtins" else f"{type(e).__module__}.{type(e).__name__}"
        raise refused(f"corrupt ({kind})") from None  # struct.error, zipfile.BadZipFile: the module says which


def _raised_by_parser(tb: TracebackType | None) -> bool:
    """Whether the innermost Python frame of `tb` runs a module of `_PARSERS` (an error raised in C, such as a
    call's TypeError, shows the frame that made the call)."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__") if tb is not None else None
    return isinstance(module, str) and module.partition(".")[0] in _PARSERS
