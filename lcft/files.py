"""File helpers shared by every stage: atomic replacement of a file, chunked hashing, JSON reading with one-line
errors (nesting bounded, for TOML too), one writer per output folder (a lock naming its holder), what lcft did not
make in a work folder or under a name of ours refused (one wording), umask-respecting modes. Why a write failed (a full disk, a file-size limit) is lcft.disk."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from lcft.disk import write_failure
from lcft.errors import LcftError, reason

HASH_CHUNK = 1 << 24  # 16 MiB reads: few system calls per GB of windows, a bounded buffer
LOCK_NAME = ".lcft.lock"  # pid and command of the process writing into a folder (informational: the lock is flock)
HELD_LOCK_ENV = "LCFT_HELD_LOCK"  # "PID FOLDER": a launcher holds FOLDER's lock for the workers it started
# lists and tables one JSON or TOML file may nest: every file lcft reads nests under 10, the tokenizers library
# refuses 128, and readers that walk the data recursively stay far inside Python's recursion limit
MAX_NESTING = 100


def temp_name(path: Path) -> Path:
    """The hidden temp sibling '.name.tmp' a file is written to before it replaces `path` (atomic rename)."""
    return path.with_name(f".{path.name}.tmp")


def fresh_file(path: Path, mode: int = 0o666) -> int:
    """Create `path` as a new, empty regular file of ours and return its open descriptor (write only): whatever
    was there (a stale file, a symlink pointing anywhere) is unlinked first, and O_EXCL | O_NOFOLLOW make the
    kernel refuse to write through a link that appears in between. The caller closes the descriptor."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # unlinks a symlink itself, never its target
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temp path next to `path`; when the block ends normally the file written there (given the mode
    the umask allows, fsynced first when asked) replaces `path` in one rename, so readers see the old file or the new one, never a torn one.
    On an exception the temp file is removed and `path` is untouched."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        os.close(fresh_file(tmp))  # a link planted under the temp name is removed, never written through
        yield tmp
        respect_umask(tmp, folder=False)  # some writers (safetensors) create 0600 files whatever the umask
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
def replacing_together(paths: list[Path]) -> Iterator[list[Path]]:
    """`replacing` for files that belong together: yield a temp path for each; once the block ends normally
    (every one written, so a full disk has failed none yet) the last path is removed, the others replace
    theirs in order, and the last comes back last: a reader that takes the last one's presence for "complete"
    never sees the old set mixed with the new. On an exception every path is untouched."""
    temps = [temp_name(p) for p in paths]
    try:
        for tmp in temps:
            os.close(fresh_file(tmp))
        yield temps
        for tmp in temps:
            respect_umask(tmp, folder=False)
        paths[-1].unlink(missing_ok=True)
        for tmp, path in zip(temps, paths, strict=True):
            os.replace(tmp, path)
    finally:
        for tmp in temps:
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


def no_follow(path: str, flags: int) -> int:
    """`os.open` of `path` that refuses a link under the name (ELOOP), also as `open`'s opener: a file of ours that
    something else may have replaced with a link is never written through it."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def not_own(path: Path, folder: bool = False) -> bool:
    """Whether something is at `path` that lcft would not have made there: a link (dangling or not), or other than
    a regular file (with `folder`: other than a folder). Nothing there is no such thing."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    return not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode))


def remove(path: Path) -> None:
    """Remove what is at `path`: a folder with all it holds, else the file or link itself (never what a link
    points to); nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


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


def files_sha256(paths: list[Path]) -> str:
    """sha256 over several files in name order: each file's name and its own sha256 (one digest per folder)."""
    h = hashlib.sha256()
    for f in sorted(paths, key=lambda p: p.name):
        h.update(f.name.encode() + b"\0" + file_hash(f).hexdigest().encode())
    return h.hexdigest()


def is_plain_name(name: Any) -> bool:
    """Whether `name` names a file directly inside a folder (never `../x`, `/etc/x`, `a/b` or `.`): every
    file a manifest, an index or a checkpoint's metadata names is opened under its own folder."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def _check_nesting(data: Any, where: str, error: type[LcftError] = LcftError) -> None:
    """Refuse parsed JSON or TOML nested deeper than MAX_NESTING lists and tables (counted level by level, no
    recursion): readers and the libraries they hand it to walk it recursively."""
    level = [data] if isinstance(data, dict | list) else []
    for _ in range(MAX_NESTING):
        level = [c for node in level for c in (node.values() if isinstance(node, dict) else node)
                 if isinstance(c, dict | list)]
        if not level:
            return
    raise error(f"{where}: nested deeper than {MAX_NESTING} levels")


def parse_text(loads: Callable[[str], Any], kind: str, text: str, where: str,
               error: type[LcftError] = LcftError) -> Any:
    """`loads(text)` (json.loads, tomllib.loads) of text read from `where` (a file, named in the message); a
    one-line `error` when it is not `kind` or is nested deeper than MAX_NESTING (the parser's own recursion
    limit included)."""
    try:
        data = loads(text)
    except RecursionError:
        raise error(f"{where}: nested deeper than {MAX_NESTING} levels") from None
    except ValueError as e:  # JSONDecodeError, TOMLDecodeError, and an integer past Python's limit of digits
        raise error(f"{where}: not valid {kind} ({e})") from None
    _check_nesting(data, where, error)
    return data


def parse_json(text: str, where: str) -> Any:
    """The JSON value of `text` read from `where`; a one-line LcftError as `parse_text` says."""
    return parse_text(json.loads, "JSON", text, where)


def read_text(path: str | os.PathLike, limit: int, what: str = "") -> str:
    """The UTF-8 text of the regular file `path`, refused when it is something else (opened without blocking: a
    FIFO in its place must not hang the reader) or larger than `limit` bytes, before it is read; a one-line
    LcftError naming it (`what`: what the file is, to begin the message)."""
    name = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LcftError(f"{name} is not a regular file")
            if st.st_size > limit:
                raise LcftError(f"{name} is {st.st_size} bytes, over the limit of {limit}")
            return fh.read(limit + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LcftError(f"{name}: cannot read it ({reason(e)})") from None


MAX_JSON_BYTES = 1 << 30  # a config, manifest or index of JSON: a window list of a whole genome is far smaller


def read_json(path: str | os.PathLike, want: type = dict) -> Any:
    """A JSON object (or a list, `want=list`) from a file; a one-line LcftError naming the file when it is
    unreadable, not a regular file, over MAX_JSON_BYTES, not JSON, nested too deep, or not an object (not a
    list)."""
    path = Path(path)
    data = parse_json(read_text(path, MAX_JSON_BYTES), str(path))
    if not isinstance(data, want):
        raise LcftError(f"{path}: not a JSON {'object' if want is dict else want.__name__}")
    return data


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
            raise LcftError(f"cannot write to output folder {shown}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid, holder = _holder(folder)
            who = f" (pid {pid})" if pid else ""
            raise LcftError(f"another `{holder or command}` is writing into {shown}{who}; wait for it to finish "
                            "or choose another output folder") from None
        made.callback(os.close, fd)
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


def refuse_nonempty_output(out: Path, force: bool, leftovers: tuple[str, ...] = ()) -> None:
    """An output folder must be a folder, new or empty unless `force`: a lock file and the `leftovers` (names
    of a killed writer's work files, which the next writer removes) do not count."""
    if out.exists() and not out.is_dir():
        raise LcftError(f"--out {out} is a file, not a folder")
    ignored = {LOCK_NAME, *leftovers}
    if out.is_dir() and any(f.name not in ignored for f in out.iterdir()) and not force:
        raise LcftError(f"{out} already exists and is not empty (use --force to overwrite)")
