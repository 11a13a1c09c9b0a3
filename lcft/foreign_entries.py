"""What lcft did not make where it keeps its own files: never resumed or written through, refused in one line."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from lcft.errors import LcftError, reason
from lcft.files import no_follow


def open_own(path: str | os.PathLike) -> IO[bytes] | None:
    """`path` opened for reading and writing ("r+b") when it is a regular file itself, of one name, else None
    (missing, a link, a folder, a FIFO, a hard link): a file a killed run of ours left, to resume, is never one
    that would make the resume write through it to another file (O_NOFOLLOW: not even a link that appears
    meanwhile; a second name: a file of someone else's, linked into the folder)."""
    try:
        fd = no_follow(os.fspath(path), os.O_RDWR | os.O_NONBLOCK)  # a FIFO opens without waiting, and is refused
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        return None
    return os.fdopen(fd, "r+b")


def resume_own(path: Path, tool: str, within: Path | None = None) -> IO[bytes] | None:
    """`path` opened by `open_own`, a file of `tool`'s that is cut and appended to in place; None where nothing is
    there. Anything else there stops with one line, nothing read or changed: `foreign_error`'s, for a second
    (hard) name of a file one saying so (cutting it would cut that file too), for a file this user may not read
    and write (another owner's, mode 0) the OS's reason."""
    kept = open_own(path)
    if kept is not None or not os.path.lexists(path):
        return kept
    if not_own(path):
        raise foreign_error(path, tool, within=within)
    whole = "" if within is None else f", or the whole {within},"
    if path.lstat().st_nlink > 1:
        raise LcftError(f"{path} is a second name of another file (a hard link), which resuming {tool} would "
                        f"change; remove it{whole} and re-run")
    try:  # a regular file of one name that open_own could not open: say why
        os.close(no_follow(os.fspath(path), os.O_RDWR | os.O_NONBLOCK))
        why = "it changed while it was opened"
    except OSError as e:
        why = e.strerror or reason(e)
    raise LcftError(f"{path}: cannot open it to resume {tool} ({why}); make it readable and writable, or remove "
                    f"it{whole} and re-run")


def not_own(path: Path, folder: bool = False) -> bool:
    """Whether something is at `path` that lcft would not have made there: a link (dangling or not), or other than
    a regular file (with `folder`: other than a folder). Nothing there is no such thing."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    return not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode))


def foreign_entry(folder: Path) -> Path | None:
    """In a work folder of ours that holds only regular files, the first thing that is not one (the folder itself
    first, which must be a folder and no link): a link, a folder, a FIFO; None when there is none. A resume that
    finds one stops with its name: reading or writing through it would reach wherever it points."""
    if not_own(folder, folder=True):
        return folder
    if not folder.is_dir():
        return None
    return next((p for p in sorted(folder.iterdir()) if not_own(p)), None)


def refuse_foreign(folder: Path, tool: str) -> None:
    """Stop with one line naming it, changing nothing, when the work folder `folder` of `tool` (the command, as
    the message names it) holds a `foreign_entry`: what lcft did not make is never removed, nor resumed through."""
    entry = foreign_entry(folder)
    if entry is not None:
        raise foreign_error(entry, tool, folder=entry == folder, within=None if entry == folder else folder)


def refuse_not_own(path: Path, tool: str, folder: bool = False) -> None:
    """Stop with `foreign_error`'s line, changing nothing, when the one file (`folder`: folder) that `tool` keeps at
    `path` is `not_own`: reading, appending or moving things through it would reach wherever it points."""
    if not_own(path, folder):
        raise foreign_error(path, tool, folder)


def foreign_error(path: Path, tool: str, folder: bool = False, within: Path | None = None) -> LcftError:
    """The one wording of what lcft did not make at `path`, where `tool` (the command) keeps a regular file (a
    folder); `within`: the work folder it is in, which may go whole."""
    what = f"a folder {tool} made (a link or a file)" if folder else f"a file {tool} wrote (a link, a folder or a FIFO)"
    whole = "" if within is None else f", or the whole {within},"
    return LcftError(f"{path} is not {what}; remove it{whole} and re-run")
