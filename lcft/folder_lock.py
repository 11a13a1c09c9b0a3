"""One writer per output folder: a lock naming its holder, which the kernel drops when the holder dies."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from lcft.disk import write_failure
from lcft.errors import LcftError
from lcft.files import expect_folder, fresh_file

LOCK_NAME = ".lcft.lock"  # pid and command of the process writing into a folder (informational: the lock is flock)
# flock's errors where a file system has no locks (Lustre mounted without -o flock: ENOSYS; NFS without its lock
# daemon: ENOLCK; some FUSE file systems): a warning, and the command runs unlocked (its pid still recorded)
NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP)
HELD_LOCK_ENV = "LCFT_HELD_LOCK"  # "PID FOLDER": a launcher holds FOLDER's lock for the workers it started


def _holder(folder: Path) -> tuple[str | None, str | None]:
    """(pid, command) recorded by the process that holds `folder`'s lock, when readable."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)  # a planted link is not read through
        with os.fdopen(fd, "rb") as fh:
            pid, _, command = fh.read(4096).decode().strip().partition(" ")
    except (OSError, UnicodeDecodeError):
        return None, None
    return (pid or None), (command or None)


def held_elsewhere(folder: str | os.PathLike) -> bool:
    """Whether `folder`'s lock seems held by a process still running (the pid its LOCK_NAME records), told without
    taking it: a check made before the lock is taken leaves such a folder to folder_lock's own one line."""
    import psutil

    pid = _holder(Path(folder))[0]
    return pid is not None and pid.isdigit() and int(pid) != os.getpid() and psutil.pid_exists(int(pid))


def _held_by_launcher(folder: Path) -> bool:
    """True when HELD_LOCK_ENV names `folder` and a pid that is an ancestor of this process and still holds
    the lock (its pid in LOCK_NAME): a worker of the launch that holds it."""
    import psutil

    pid, _, path = os.environ.get(HELD_LOCK_ENV, "").partition(" ")
    if not pid.isdigit() or not folder.is_dir() or path != str(folder.resolve()) or _holder(folder)[0] != pid:
        return False
    with contextlib.suppress(psutil.Error):
        return int(pid) in {p.pid for p in psutil.Process().parents()}
    return False


@contextlib.contextmanager
def made_folder(folder: Path) -> Iterator[Path]:
    """`folder`, made when missing (its missing parents too) for the block; at the end, what was made here is
    removed while empty, deepest first (nothing half-written on an error; never a folder that was there before).
    A folder that cannot be made raises OSError on entering."""
    # deepest first; `a/..` names no folder of its own (mkdir -p of `a/../b` makes a/, then b)
    made = [p for p in (folder, *folder.parents) if p.name != ".." and not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
    finally:
        for p in made:  # (also those made before a failed mkdir)
            try:
                p.rmdir()  # only succeeds when empty
            except OSError:
                break  # not empty, gone or not removable: its parents hold it


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str, shown: str | os.PathLike | None = None) -> Iterator[Path]:
    """Hold an exclusive lock on an output folder (created when missing) while the block runs: a second
    writer gets a one-line error naming the holder's command and pid. The lock is flock(2) on the folder
    itself, so the kernel drops it when its holder dies (kill -9 included) and the next writer takes it over;
    the holder's pid is kept in LOCK_NAME inside, removed at the end. The folder and parents made here that
    are empty at the end are removed (`made_folder`). `shown`: the folder the messages name (a writer that
    locks a hidden work folder of its output names the output)."""
    folder = Path(folder)
    shown = folder if shown is None else shown
    if _held_by_launcher(folder):  # the launcher took the lock before it wrote anything; its worker re-enters
        yield folder
        return
    with contextlib.ExitStack() as made:  # left last: the lock file and descriptor go first
        try:
            made.enter_context(made_folder(folder))
            fd = os.open(folder, os.O_RDONLY)
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:  # said as such by the command (lcft.cli.common.user_errors)
                raise
            expect_folder(shown, "--out")  # a file where it goes, or above it: said so, not as 'File exists'
            raise LcftError(f"cannot write to output folder {shown}: {e.strerror or e}") from None
        made.callback(os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, holder = _holder(folder)
            who = f" (pid {pid})" if pid else ""
            raise LcftError(f"another `{holder or command}` is writing into {shown}{who}; wait for it to finish "
                            "or choose another output folder") from None
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
            print(f"warning: {shown} is on a file system that does not lock (flock: {e.strerror}; Lustre without "
                  "-o flock, NFS without lockd): nothing stops a second command writing into it meanwhile; run one "
                  "at a time there", file=sys.stderr)
        info = folder / LOCK_NAME
        try:  # over a killed holder's pid, or a planted link; a folder we may read but not write fails here
            pid_fd = fresh_file(info, 0o644)
        except OSError as e:
            raise LcftError(f"cannot write to output folder {shown}: {e.strerror or e}") from None
        made.callback(info.unlink, missing_ok=True)  # before the folder's descriptor closes
        try:  # a full disk or a file-size limit fails the first write of every command here
            with os.fdopen(pid_fd, "w") as fh:
                fh.write(f"{os.getpid()} {command}\n")
        except OSError as e:
            raise LcftError(f"cannot write to output folder {shown}: {write_failure(e)}") from None
        yield folder


def refuse_nonempty_output(out: Path, force: bool, leftovers: tuple[str, ...] = ()) -> None:
    """An output folder must be a folder, new or empty unless `force`: a lock file and the `leftovers` (names
    of a killed writer's work files, which the next writer removes) do not count."""
    expect_folder(out, "--out")
    ignored = {LOCK_NAME, *leftovers}
    if out.is_dir() and any(f.name not in ignored for f in out.iterdir()) and not force:
        raise LcftError(f"{out} already exists and is not empty (use --force to overwrite)")
