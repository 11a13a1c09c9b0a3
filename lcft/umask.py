"""The umask's mode for what lcft makes, also where a writer (tempfile, safetensors) made it private."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from pathlib import Path

NO_MODES = (errno.EPERM, errno.EOPNOTSUPP)
"""chmod's errors on a file system that does not take modes, even of a file the process just made: vfat and exfat
(EPERM unless mounted with -o quiet), CIFS shares whose files show as the mounting user's (EPERM), some FUSE."""
_told: set[int] = set()  # the file systems (st_dev) whose refusal was said: once each per process


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
    """Give a folder (or file) made by tempfile (0700/0600) the mode a plain mkdir/open would have; where the file
    system refuses modes (NO_MODES) it keeps the one it was made with, said once per file system."""
    try:
        os.chmod(path, (0o777 if folder else 0o666) & ~umask())
    except OSError as e:
        if e.errno not in NO_MODES:
            raise
        where = Path(path).parent
        device = os.stat(path).st_dev
        if device not in _told:
            _told.add(device)
            print(f"warning: {where} is on a file system that does not take file modes (chmod: {e.strerror}; "
                  "vfat or exfat without -o quiet, a CIFS share): what lcft writes there keeps the mode it was "
                  "made with, which may be private to you", file=sys.stderr)
