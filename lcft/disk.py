"""Why a write failed, in one line: a full disk, a quota, a file past the filesystem's or this process's file-size
limit (`ulimit -f`), including the writers (torch's zip stream, safetensors) that report these only as text; the
room a write asks for first, or keeps free as it goes when its size is unknown; a folder that cannot be removed,
said, since it keeps its disk space; and a file system that will not rename a folder."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from lcft.errors import LcftError, reason

KEEP_FREE = 1 << 30
"""What a write of unknown size (a download whose server gives no size) leaves free on its filesystem, or a
twentieth of a smaller one: it stops there, before the disk is full and every other writer on it fails too."""


def mib(n: int) -> str:
    """`n` bytes in MiB, one decimal: how sizes are said in the one-line messages about room."""
    return f"{n / (1 << 20):.1f} MiB"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, each once."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _write_fault(exc: BaseException) -> int | None:
    """ENOSPC, EDQUOT or EFBIG when that is what failed a write, anywhere in the exception chain: an OSError's
    errno, or the wording of a library that reports it as text (safetensors quotes the OS error); None for
    anything else, torch's zip writer's stream errors included (they do not say why)."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return e.errno
        text = str(e).lower()
        for words, code in (("file too large", errno.EFBIG), ("no space left", errno.ENOSPC),
                            ("quota exceeded", errno.EDQUOT)):
            if words in text:
                return code
    return None


def out_of_room(exc: BaseException) -> bool:
    """Whether a full disk or a quota (ENOSPC, EDQUOT) failed a write: freeing space lets it go on, unlike a file
    too large (EFBIG) or any other failure."""
    return _write_fault(exc) in (errno.ENOSPC, errno.EDQUOT)


def _stream_failed(exc: BaseException) -> bool:
    """torch's zip writer's words for a write the OS refused, whatever the reason."""
    return any("file write failed" in str(e).lower() for e in _chain(exc))


def file_size_limit() -> int | None:
    """This process's limit on the size of a file it writes (RLIMIT_FSIZE, `ulimit -f`); None when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def write_failure(e: OSError) -> str:
    """Why a write failed, for a one-line message: the OS's words and errno, and for a file too large (EFBIG)
    this process's file-size limit, since `ulimit -f` is a cause the OS's words do not name."""
    why = f"{e.strerror or e} (errno {e.errno})"
    if e.errno == errno.EFBIG and (limit := file_size_limit()) is not None:
        why += f"; the file-size limit (ulimit -f) is {limit:,} bytes"
    return why


# the errnos of a folder rename a file system refuses (a file's it takes): gcsfuse on a flat bucket past its
# --rename-dir-limit (0 by default) says EMFILE, other FUSE and network mounts EXDEV, EPERM, ENOTSUP or ENOSYS
RENAME_REFUSED = (errno.EMFILE, errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def rename_refused(e: OSError, where: str | os.PathLike) -> str | None:
    """The one line for a folder rename in `where` that its file system refuses (RENAME_REFUSED), with the
    remedy; None for any other error (the caller's own handling)."""
    if e.errno not in RENAME_REFUSED:
        return None
    return (f"cannot rename folders on the file system of {where} ({write_failure(e)}): gcsfuse renames a folder "
            "only under its --rename-dir-limit (0 by default: raise it, or use a bucket with hierarchical "
            "namespace); else use an output folder on another file system")


def _usage(folder: str | os.PathLike) -> tuple[int, int] | None:
    """(size, free bytes) of the filesystem of `folder` (or of its nearest existing parent); None when unknown."""
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        usage = shutil.disk_usage(p)
    except OSError:
        return None
    return usage.total, usage.free


def free_bytes(folder: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem of `folder` (or of its nearest existing parent); None when unknown."""
    usage = _usage(folder)
    return None if usage is None else usage[1]


def kept_free(folder: str | os.PathLike) -> tuple[int, int] | None:
    """(free bytes, bytes kept free) on the filesystem of `folder`: a write of unknown size into it stops before
    the free space falls under the second (KEEP_FREE, or a twentieth of a smaller filesystem); None when unknown."""
    usage = _usage(folder)
    if usage is None:
        return None
    total, free = usage
    return free, min(KEEP_FREE, total // 20)


def check_room(folder: str | os.PathLike, at_least: int, what: str) -> None:
    """Refuse, before anything is written, `what` (a write into `folder` of at least `at_least` bytes) when the
    free space there is less: one line naming both, where a disk found full midway would also have failed the
    writes of everything else on it meanwhile. Nothing when the free space is unknown."""
    free = free_bytes(folder)
    if free is not None and free < at_least:
        raise LcftError(f"no space left on the device of {folder}: {what} needs at least {mib(at_least)}, "
                        f"{mib(free)} free")


def _fault(exc: BaseException, needed: int | None, free_at_failure: int | None) -> int | None:
    """What failed a write (ENOSPC, EDQUOT, EFBIG) or None. A stream error of torch's zip writer does not say:
    a full disk when the free space the caller measured right after the failure is under 1 MiB (or under
    `needed`), else the file-size limit when it is below `needed` (no file of the write is larger), else a full
    disk when it says 'file write failed'."""
    if (fault := _write_fault(exc)) is not None:
        return fault
    if free_at_failure is not None and (free_at_failure < (1 << 20) or bool(needed) and free_at_failure < needed):
        return errno.ENOSPC
    stream = _stream_failed(exc)
    if (stream or free_at_failure is not None) and needed and (limit := file_size_limit()) is not None \
            and limit < needed:
        return errno.EFBIG
    return errno.ENOSPC if stream else None


def disk_full_error(exc: BaseException, folder: str | os.PathLike, needed: int | None,
                    free_at_failure: int | None = None) -> LcftError | None:
    """A one-line LcftError naming the folder and the space a write needs, when `exc` means the disk is full, or
    that a file grew past what the filesystem or the process's file-size limit allows (EFBIG, `ulimit -f`); None
    otherwise (the caller re-raises `exc`). `free_at_failure`: the free space the caller measured right after
    the failure, for writers that report either only as a stream error (_fault)."""
    fault = _fault(exc, needed, free_at_failure)
    if fault is None:
        return None
    if fault == errno.EFBIG:
        limit = file_size_limit()
        ulimit = f"{limit:,} bytes" if limit is not None else "unlimited"
        need = f"; this write needs about {mib(needed)}" if needed else ""
        return LcftError(f"file too large for {folder}: over the largest file its filesystem takes or this "
                         f"process's file-size limit (ulimit -f: {ulimit}){need}")
    need = f"needs about {mib(needed)}" if needed else "needs more space"
    free = free_bytes(folder)
    have = f", {mib(free)} free" if free is not None else ""
    return LcftError(f"no space left on the device of {folder}: this write {need}{have}")


@contextlib.contextmanager
def write_faults(path: str | os.PathLike) -> Iterator[None]:
    """Writes into `path` (a file or folder) whose failure for a full disk or a file too large (disk_full_error)
    is a one-line LcftError naming it; any other exception passes as it is."""
    try:
        yield
    except LcftError:
        raise  # already one line, said where it failed (a message may quote "File too large" itself)
    except Exception as e:
        err = disk_full_error(e, path, None)
        if err is None:
            raise
        raise err from None


def remove_tree(folder: Path) -> str | None:
    """Remove `folder` with everything in it, as much as can be (a folder already gone is fine); returns why
    something stays (the first failure), or None."""
    failed: list[str] = []

    def note(_func: object, _path: str, exc_info: tuple) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):  # removed meanwhile: what we wanted
            failed.append(reason(exc_info[1]))

    shutil.rmtree(folder, onerror=note)
    return failed[0] if failed else None


def kept_space(what: str, later: str = "") -> str:
    """The warning that `what` ("FOLDER: WHY", and what it is) could not be removed; `later`: who tries again."""
    return f"warning: cannot remove {what}; its disk space stays in use until it is removed{later}"


def removed_or_said(folder: Path, warn: Callable[[str], None] | None, what: str, later: str = "") -> bool:
    """Remove `folder` (`remove_tree`); whether it is gone. One that stays is a `kept_space` warning to `warn`
    naming `what` it is and why: a leftover is never left in silence, holding what may be gigabytes."""
    why = remove_tree(folder)
    if why is not None and warn is not None:
        warn(kept_space(f"{what}: {why}", later))
    return why is None
