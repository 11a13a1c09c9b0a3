"""Atomic writes (a file replaced in one rename, never through a link) and bounded reading of JSON and text."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from lcft.errors import LcftError, reason
from lcft.umask import respect_umask

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


def no_follow(path: str, flags: int) -> int:
    """`os.open` of `path` that refuses a link under the name (ELOOP), also as `open`'s opener: a file of ours that
    something else may have replaced with a link is never written through it."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def remove(path: Path) -> None:
    """Remove what is at `path`: a folder with all it holds, else the file or link itself (never what a link
    points to); nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def resolved(path: str | os.PathLike) -> Path:
    """`path` absolute, its links followed (as far as they exist); a one-line LcftError naming it when its links
    lead back to themselves (Python 3.11 and 3.12 raise RuntimeError for such a loop, later ones OSError)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as e:
        why = reason(e) if isinstance(e, OSError) else "symbolic links in a loop"
        raise LcftError(f"{path}: cannot follow its links ({why})") from None


def dangling(p: Path) -> bool:
    """Whether `p` is a link to nothing (not a loop of links: `resolved` names that)."""
    try:
        p.stat()
    except FileNotFoundError:
        return p.is_symlink()
    except OSError:
        return False
    return False


def expect_folder(path: str | os.PathLike, option: str = "", hint: str = "") -> None:
    """`path` (given as `option`) is a folder or not there yet: a file there or above it is one line naming it,
    and `hint` after it (what folder is wanted, where a file there is a common slip)."""
    for p in (Path(path), *Path(path).parents):  # (mkdir said only 'File exists' or 'Not a directory')
        if dangling(p):  # mkdir makes no folder through a link to nothing: said before any work
            said = f"{option} {path}{'' if p == Path(path) else f': {p}'} is a link to {os.readlink(p)}, which is not there"
            raise LcftError(f"{said.lstrip()}; create that folder or give another path")
        with contextlib.suppress(OSError):  # not there, or not ours to look at: the command's own open says so
            if not stat.S_ISDIR(p.stat().st_mode):
                said = f"{option} {path}{'' if p == Path(path) else f': {p}'} is a file, not a folder".lstrip()
                raise LcftError(f"{said}; {hint}" if hint else said)
            return


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


READ_CHUNK = 1 << 20  # what a file longer than its size said is read on by: a buffer of the bound is asked only as it fills


def read_capped(fh: IO[bytes], size: int, limit: int) -> bytes:
    """What the open file `fh` holds, `size` bytes as its stat said, but never more than `limit` + 1 bytes, whatever
    it holds (a file grown since, or one of /proc that says 0): a caller refuses more than `limit`. A read asks
    Python for a buffer of the length it is given first, so a read of the bound itself (hundreds of MiB) would
    reserve it for every small file, which a node that does not overcommit memory refuses (MemoryError)."""
    want = min(size, limit) + 1
    data = fh.read(want)
    if len(data) < want:
        return data
    parts, total = [data], len(data)
    while total <= limit and (chunk := fh.read(min(READ_CHUNK, limit + 1 - total))):
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def read_bytes(path: str | os.PathLike, limit: int, what: str = "") -> bytes:
    """The bytes of the regular file `path`, refused when it is something else (opened without blocking: a FIFO in
    its place must not hang the reader) or larger than `limit` bytes, before it is read and as it is read (a file
    grown since, or one of /proc that says 0: `read_capped`). A one-line LcftError naming it (`what`: what the file
    is, to begin the message)."""
    name = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LcftError(f"{name} is not a regular file")
            if st.st_size > limit:
                raise LcftError(f"{name} is {st.st_size} bytes, over the limit of {limit}")
            data = read_capped(fh, st.st_size, limit)
    except OSError as e:
        raise LcftError(f"{name}: cannot read it ({reason(e)})") from None
    if len(data) > limit:
        raise LcftError(f"{name} grew past the limit of {limit} bytes as it was read")
    return data


def read_text(path: str | os.PathLike, limit: int, what: str = "") -> str:
    """The UTF-8 text of the regular file `path` (`read_bytes`: refused when it is something else or larger than
    `limit` bytes, before it is read); a one-line LcftError naming it (`what`: what the file is, to begin the
    message)."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LcftError(f"{f'{what} {path}' if what else path}: cannot read it ({reason(e)})") from None


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def present(path: str | os.PathLike, what: str = "") -> bool:
    """Whether the file `path`, which a folder may or may not hold (a model folder's lcft.json, a checkpoint's
    checksums, a tokenizer's role files), is there: True for a regular file (through its links), False where nothing is under
    the name. Anything else there (a folder, a FIFO, a device, links in a loop or to nothing) is a one-line
    LcftError naming it (`what`: what the file is, to begin the message): taken for a missing file, it would
    change what the folder is read as without a word."""
    name = f"{what} {path}" if what else str(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        if not os.path.lexists(path):
            return False
        raise LcftError(f"{name} is a symbolic link to nothing, not a regular file") from None
    except OSError as e:  # links in a loop (ELOOP), a name too long, a folder not ours to look into
        raise LcftError(f"{name} is there but cannot be read as a file ({e.strerror or reason(e)})") from None
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "something else")
        raise LcftError(f"{name} is {kind}, not a regular file")
    return True


MAX_JSON_BYTES = 1 << 30  # a manifest or record of JSON lcft writes: a window list of a whole genome is far smaller
# The small JSON files a model folder ships: config.json, lcft.json, tokenizer_config.json, special_tokens_map.json
# and the weights' index. A config.json is a few KB; the index of the largest model lcft builds (config.MAX_MLPS: 16384
# MLPs, ~57K tensors) is ~6 MB, DeepSeek-V3's 9 MB. Read whole, parsed and carried into every checkpoint, they
# must not cost what a file of 1 GiB would: a 183 MB index took 1.4 GB and a minute and a half to export.
MAX_MODEL_JSON_BYTES = 16 << 20


def read_json(path: str | os.PathLike, want: type = dict, limit: int | None = None) -> Any:
    """A JSON object (or a list, `want=list`) from a file; a one-line LcftError naming the file when it is
    unreadable, not a regular file, over `limit` bytes (a model folder's small files: MAX_MODEL_JSON_BYTES), not
    JSON, nested too deep, or not an object (not a list)."""
    return json_of(read_text(path, MAX_JSON_BYTES if limit is None else limit), path, want)


def json_of(text: str, path: str | os.PathLike, want: type = dict) -> Any:
    """The JSON object (or list, `want=list`) `text`, the file `path` as read (read_text): a one-line LcftError
    naming it when it is not JSON, nested too deep, or not an object (not a list)."""
    data = parse_json(text, str(path))
    if not isinstance(data, want):
        raise LcftError(f"{path}: not a JSON {'object' if want is dict else want.__name__}")
    return data

