"""A launch's private temporary folder (`launch_folder`): made in TMPDIR, locked (flock) and marked while its
launcher runs, removed at its end; those that killed launchers left (SIGKILL gives no time to clean up) are
removed by the next launch on the same machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lcft.files import temp_name
from lcft.launch.process import FAILURES_ENV, HANDED_ENV, READY_ENV, RESULT_FILE_ENV
from lcft.liveness import FAILURE_FILE_ENV
from lcft.signals import GROUP_ENDING_ENV

FOLDER_NAME = re.compile(r"lcft-launch-[a-z0-9_]{8}")  # tempfile.mkdtemp's names with the launch's prefix
MARK = "launcher"
"""A file in a launch's temporary folder holding the running kernel's boot id (BOOT_ID), made once the launcher
holds its lock (flock on the folder, which the kernel drops when the launcher dies, SIGKILL included): a folder
marked by this kernel whose lock a later launch can take was left by a killed launcher, and goes (`_sweep`). The
boot id keeps the sweep to folders whose lock this kernel holds: a TMPDIR shared by several machines whose
locks are each machine's own (NFS with local_lock, BeeGFS, Lustre's localflock) would show another machine's
running launch's folder unlocked here."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# The files a launch hands its agent and workers through the environment, by variable.
FILES = {FAILURE_FILE_ENV: "failure.txt", FAILURES_ENV: "failures.json", RESULT_FILE_ENV: "result.json",
         HANDED_ENV: "handed", READY_ENV: "ready", GROUP_ENDING_ENV: "group-ending.txt"}
_LAYOUT = frozenset({MARK, "spec.toml", "spare", "logs", *FILES.values()})
"""Every name a launch's temporary folder may hold (and their atomic_write temporaries): a folder with anything
else in it is not taken for one."""


@contextlib.contextmanager
def launch_folder() -> Iterator[Path]:
    """A private temporary folder for one launch (mode 0700, in TMPDIR), locked and marked (MARK) while the block
    runs and removed at its end, its lock last; the folders that killed launchers left there go first."""
    _sweep(Path(tempfile.gettempdir()))
    tmp = Path(tempfile.mkdtemp(prefix="lcft-launch-"))
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # A file system without locks, or no boot id to tell this kernel's folders by: no mark, so never removed
        # by another launch. (A launch sweeping waits only while it looks in; the mark comes once the lock is
        # held, so it never takes a folder being made.)
        with contextlib.suppress(OSError):
            kernel = _kernel()
            fcntl.flock(fd, fcntl.LOCK_EX)
            mark = os.open(MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            try:
                os.write(mark, kernel)
            finally:
                os.close(mark)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def _sweep(folder: Path) -> None:
    """Remove the launch folders in `folder` that killed launchers left (the OOM killer's or a scheduler's SIGKILL
    gives them no time to): this user's, laid out as a launch's, marked, and with their lock free. A pid cannot
    tell: it may be reused, or another container's with the same host name and TMPDIR."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if FOLDER_NAME.fullmatch(name):
                with contextlib.suppress(OSError):  # another user's, or gone since the listing
                    _remove_left(folder / name)


def _kernel() -> bytes:
    """The running kernel's boot id (36 bytes and a newline; OSError where there is none to read)."""
    with BOOT_ID.open("rb") as f:
        kernel = f.read(64)
    if len(kernel) != 37:
        raise OSError(f"{BOOT_ID}: not a boot id")
    return kernel


def _remove_left(path: Path) -> None:
    """Remove `path` when it is a launch folder of this user that its launcher on this kernel left (see `_sweep`)."""
    if os.lstat(path).st_uid != os.getuid():  # another user's: theirs to remove
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its launcher runs
        names = set(os.listdir(fd))
        allowed = _LAYOUT | {temp_name(Path(n)).name for n in _LAYOUT}
        if MARK in names and names <= allowed and _marked_here(fd) and os.path.samestat(os.fstat(fd), os.lstat(path)):
            shutil.rmtree(path)
    finally:
        os.close(fd)


def _marked_here(folder: int) -> bool:
    """Whether the open folder's MARK is a plain file holding this kernel's boot id."""
    mark = os.open(MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)  # a link: ELOOP
    try:
        return stat.S_ISREG(os.fstat(mark).st_mode) and os.read(mark, 64) == _kernel()
    finally:
        os.close(mark)
