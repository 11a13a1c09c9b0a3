"""Chunked hashing of files: a file's digest, its record (size and sha256), one digest over several."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO, Any

HASH_CHUNK = 1 << 24  # 16 MiB reads: few system calls per GB of windows, a bounded buffer


def file_hash(path: str | os.PathLike | IO[bytes], algorithm: str = "sha256", upto: int | None = None) -> Any:
    """A hashlib object fed with the first `upto` bytes of a file (all of it when None), read in chunks; the file
    is named, or open for reading at its start (then left open, at the offset the reading ends)."""
    if not isinstance(path, str | os.PathLike):
        return _hash_open(path, hashlib.new(algorithm), upto)
    with open(path, "rb") as fh:
        return _hash_open(fh, hashlib.new(algorithm), upto)


def _hash_open(fh: IO[bytes], h: Any, upto: int | None) -> Any:
    left = os.fstat(fh.fileno()).st_size if upto is None else upto
    while left > 0:
        block = fh.read(min(HASH_CHUNK, left))
        if not block:
            break
        h.update(block)
        left -= len(block)
    return h


def file_record(path: str | os.PathLike) -> dict[str, Any]:
    """{"bytes": its size, "sha256": its digest} of a file: how a checkpoint's checksum list, and an export's
    record, list each of its files."""
    return {"bytes": os.stat(path).st_size, "sha256": file_hash(path).hexdigest()}


def files_sha256(paths: list[Path]) -> str:
    """sha256 over several files in name order: each file's name and its own sha256 (one digest per folder)."""
    h = hashlib.sha256()
    for f in sorted(paths, key=lambda p: p.name):
        h.update(f.name.encode() + b"\0" + file_hash(f).hexdigest().encode())
    return h.hexdigest()
