"""Which --out an `lcft export` may write to, decided before the checkpoint is read and without torch: new, empty,
--force, or holding what an earlier run of the same export left; and what an export records of where it came from
(lcft.json's "export": the content of what it read of its source, the dtype it wrote, the lcft version, and its
files' sizes and sha256), by which a complete export in --out is told to be this very export (nothing to write)
or another (refused), without building anything."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcft import __version__
from lcft.checkpoint.layout import (
    CHECKSUMS,
    EXPORT_WORK,
    MODEL_CONFIG,
    MODEL_META,
    Identity,
    check_output_folder,
    read_meta_file,
    refuse_out_inside,
    unchanged,
)
from lcft.checkpoint.model_files import is_sharded_checkpoint, model_files, weights_dtype
from lcft.errors import LcftError
from lcft.files import present, temp_name
from lcft.folder_lock import LOCK_NAME, refuse_nonempty_output
from lcft.hashing import file_hash, file_record

EXPORT_RECORD = "export"  # lcft.json's key in an export: export_record (no other reader needs it)
FILES = "files"  # the record's files: {name: lcft.hashing.file_record}, as a checkpoint's checksums.json lists them

Origin = Callable[[], dict[str, Any]]  # the origin of the export being made, computed when first needed


def check_export_out(out: Path, source: str | os.PathLike, force: bool, origin: Origin) -> bool:
    """`out` may take an export of the checkpoint `source` (`lcft export`): not the checkpoint itself or a folder in
    it (its files would be replaced by the export's, and its checksums no longer hold), and by `holds_this_export`.
    Returns whether it already holds this export, complete: nothing is to be written. Writes nothing."""
    refuse_out_inside(out, Path(source), "the export")
    check_output_folder(out, "the export", ("model",))  # --force replaces an earlier export, never a run
    return holds_this_export(out, force, origin)


def holds_this_export(out: Path, force: bool, origin: Origin) -> bool:
    """Whether `out` holds, complete, the export whose origin is `origin()`. Without `force`, an `out` that is not
    new or empty is refused in one line unless `maybe_exported`; one holding a complete export (config.json, moved in
    last, and no work folder left) is this export when its lcft.json records this origin and the files it lists, of
    their sizes and sha256, are all there is; else refused, as --out is never changed without --force when it
    holds what this export would not write (one recording no origin, or no file hashes, of an earlier lcft, is
    compared once built). One a kill left a work folder of (a half-moved export, or one
    killed before its work folder went) is let through: whether its files are this export's is known once built,
    and the export removes what the kill left (lcft.checkpoint.export). With `force`: False (the export replaces
    the model files)."""
    refuse_nonempty_output(out, force or maybe_exported(out), (EXPORT_WORK,))
    if force or not out.is_dir() or not (out / MODEL_CONFIG).is_file() or _work_left(out):
        return False
    recorded = _recorded(out)
    if recorded is None:  # an export of an lcft that recorded none: built again, and its files compared byte for
        return False  # byte (lcft.checkpoint.export), the same export said to be there, another refused
    files = recorded.pop(FILES)
    if recorded != origin():
        raise LcftError(f"{out} already holds an export of another checkpoint, --dtype or lcft version (use --force "
                        "to overwrite)")
    theirs = {p.name: p.stat().st_size for p in out.iterdir() if p.name not in (LOCK_NAME, MODEL_META)}
    for name in sorted(theirs.keys() | files.keys()):
        if name not in files:
            raise foreign_file(out, name)
        if theirs.get(name) != files[name]["bytes"]:  # sizes first: a file missing or cut short, without hashing
            raise _altered(out, name)
    for name in sorted(files):  # a byte changed in place (a bad disk, an edit) keeps the size
        if file_hash(out / name).hexdigest() != files[name]["sha256"]:
            raise _altered(out, name)
    return True


def _altered(out: Path, name: str) -> LcftError:
    """The refusal of a complete export of this origin whose file `name` is missing or not as it was written."""
    return LcftError(f"{out} holds this export, but its {name} is missing or changed since it was written (use "
                     "--force to overwrite)")


def foreign_file(out: Path, name: str) -> LcftError:
    """The refusal of an `out` holding a file `name` that the export does not write (or writes otherwise)."""
    return LcftError(f"{out} already exists and its {name} is not this export's (use --force to overwrite)")


def maybe_exported(out: Path) -> bool:
    """Whether `out` may hold an export published in part or whole by an earlier run of it, killed while it moved
    its files in or after: only regular files besides the lock, and either the work folder (there until
    config.json, the last file, is in) or config.json and lcft.json. Anything else (a user's files, a folder) is
    refused by `holds_this_export` before the checkpoint is read."""
    if not out.is_dir():
        return False
    names = {p.name for p in out.iterdir()} - {LOCK_NAME, EXPORT_WORK}
    if not all((out / n).is_file() and not (out / n).is_symlink() for n in names):
        return False
    return (out / EXPORT_WORK).is_dir() or {MODEL_CONFIG, MODEL_META} <= names


def _work_left(out: Path) -> bool:
    """Whether an export of `out` killed midway left its work folder: in `out`, or the hidden sibling that held it
    while `out` was new."""
    return (out / EXPORT_WORK).exists() or temp_name(out).exists()


def _recorded(out: Path) -> dict[str, Any] | None:
    """The record of the export in `out` (`export_record`); None where its lcft.json holds none (or cannot be
    read), or lists its files without their size and sha256 (an earlier lcft's)."""
    try:
        recorded = read_meta_file(out).get(EXPORT_RECORD)
    except LcftError:
        return None
    files = recorded.get(FILES) if isinstance(recorded, dict) else None
    ok = isinstance(files, dict) and all(isinstance(v, dict) and type(v.get("bytes")) is int
                                         and isinstance(v.get("sha256"), str) for v in files.values())
    return recorded if ok else None


def export_record(origin: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What the export built in `folder` records in its lcft.json (EXPORT_RECORD): its origin (`export_origin`) and
    the size and sha256 of each of its other files."""
    return {**origin, FILES: {p.name: file_record(p) for p in sorted(folder.iterdir()) if p.name != MODEL_META}}


def export_origin(source: Path, dtype: str | None, since: Identity = None) -> dict[str, Any]:
    """What an export of the model folder `source` with --dtype `dtype` (None: as stored) records of where it came
    from: the sha256 of the source's content (`model_sha256`), the dtype it writes and this lcft's version (another
    may write other bytes). The same origin means the same export. The dtype written: `dtype`, else the one the
    weights are saved in as stored (their headers read, no tensor: their one dtype, or the one holding all of
    several, lcft.model.weight_files.stored_dtype), so that --dtype naming it is the same export; None (as stored)
    where that is not known without torch: a sharded checkpoint's, whose --dtype naming the dtype its DCP metadata
    stores (read with torch, only then) is None too. `since`: the folder's identity when it was first read
    (lcft.checkpoint.layout.unchanged): replaced since, its content is not the one exported."""
    with unchanged(source, since):
        content = model_sha256(source)
        written = dtype or weights_dtype(source)
        if dtype is not None and is_sharded_checkpoint(source):  # torch only here: a --dtype of a sharded source
            from lcft.checkpoint.dcp import check_sharded_readable

            written = None if str(check_sharded_readable(source)).removeprefix("torch.") == dtype else dtype
    return {"source_sha256": content, "dtype": written, "lcft": __version__}


def model_sha256(folder: Path) -> str:
    """sha256 identifying the content of the model folder `folder`: its checksums.json's (the size and sha256 of
    each of its files, which resolving the checkpoint verified them against), else over the path and sha256 of each
    file a read of its model opens (lcft.checkpoint.model_files: its config, lcft.json, tokenizer and weight files,
    a sharded checkpoint's dcp/ shards), so that a README, or weights it does not read, neither make it another
    source nor cost a read."""
    if present(folder / CHECKSUMS):
        return file_hash(folder / CHECKSUMS).hexdigest()
    h = hashlib.sha256()
    for f in sorted(model_files(folder)):
        name = f.relative_to(folder).as_posix()
        h.update(name.encode() + b"\0" + file_hash(f).hexdigest().encode() + b"\n")
    return h.hexdigest()
