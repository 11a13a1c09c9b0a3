"""Room for what a launch's processes write back into its temporary folder (rank 0's summary, each rank's hand-over,
the agent's failures, a lost rank's diagnosis) once that folder's file system is full: the launcher reserves it, the
first writer that finds the disk full frees it. Below lcft.liveness and lcft.launch, which both write back."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lcft.errors import LcftError

T = TypeVar("T")

SPARE_ENV = "LCFT_SPARE"  # set by the launcher: the file of SPARE_BYTES it reserved in its temporary folder
SPARE_BYTES = 256 * 1024
"""Room for what the workers and the agent write back (the summary, each rank's hand-over, the failures; a block
each) once the temporary folder's file system is full: the first writer that finds it full frees it (`write_back`)."""


def unwritable(folder: str | os.PathLike, error: OSError, consequence: str) -> LcftError:
    """The user error when the launch's temporary folder cannot take a file: its `consequence`, then the remedy."""
    return LcftError(f"cannot write to the launch's temporary folder {folder} ({error.strerror or error}): "
                     f"{consequence}; free space there or set TMPDIR to a writable folder")


def reserve(folder: Path) -> Path:
    """The launcher's spare room in its temporary folder (SPARE_BYTES, allocated now): a full file system is refused
    before any process starts, and one that fills while the run goes on still takes what the processes write back."""
    spare = folder / "spare"
    try:
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, SPARE_BYTES)
        finally:
            os.close(fd)
    except OSError as e:
        raise unwritable(folder, e, "the workers could not hand back how the run ended") from None
    return spare


def write_back(write: Callable[[], T]) -> T:
    """write() into the launch's temporary folder; when its file system is full, once more after freeing the
    launcher's spare room (`reserve`; another process may have freed it first)."""
    try:
        return write()
    except OSError as e:
        spare = os.environ.get(SPARE_ENV)
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not spare:
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spare)
        return write()
