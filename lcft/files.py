"""File helpers shared by every stage: atomic replacement of a file, chunked hashing, JSON reading with one-line errors."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from lcft.errors import LcftError

HASH_CHUNK = 1 << 24  # 16 MiB reads: few system calls per GB of windows, a bounded buffer


def temp_name(path: Path) -> Path:
    """The hidden temp sibling a file is written to before it replaces `path`: '.name.tmp' in the same folder
    (same filesystem, so the rename is atomic)."""
    return path.with_name(f".{path.name}.tmp")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temp path next to `path`; when the block ends normally the file written there (fsynced first
    when asked) replaces `path` in one rename, so readers see the old file or the new one, never a torn one.
    On an exception the temp file is removed and `path` is untouched."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, fsync: bool = False, **open_kw: Any) -> Iterator[IO]:
    """`open(path, mode)` whose content appears under `path` only once the block ends without an exception
    (see `replacing`). The handle may be closed inside the block (e.g. by a writer that owns it)."""
    with replacing(path, fsync=fsync) as tmp, open(tmp, mode, **open_kw) as fh:
        yield fh


def atomic_write(path: str | os.PathLike, data: str | bytes, *, fsync: bool = False) -> Path:
    """Write text or bytes to `path` atomically (temp file in the same folder, then rename)."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync) as fh:
        fh.write(data)
    return Path(path)


def file_hash(path: str | os.PathLike, algorithm: str = "sha256", upto: int | None = None) -> Any:
    """A hashlib object fed with the first `upto` bytes of a file (all of it when None), read in chunks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        left = os.fstat(fh.fileno()).st_size if upto is None else upto
        while left > 0:
            block = fh.read(min(HASH_CHUNK, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file; a one-line LcftError naming the file when it is unreadable, not JSON, or not
    an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LcftError(f"{path}: not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LcftError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, dict):
        raise LcftError(f"{path}: not a JSON object")
    return data
