"""The umask's mode for what lcft makes, also where a writer (tempfile, safetensors) made it private."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def umask() -> int:
    """The process umask: from /proc on Linux (no change, so no race with other threads creating files),
    else set and restored at once."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def respect_umask(path: str | os.PathLike, folder: bool = True) -> None:
    """Give a folder (or file) made by tempfile (0700/0600) the mode a plain mkdir/open would have."""
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())
