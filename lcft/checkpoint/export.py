"""A checkpoint's model as an HF folder (`lcft export`): from a plain checkpoint's model in memory, or streamed
from DCP shards one safetensors shard at a time; built in a locked work folder, so a new --out appears complete or
not at all, a killed export leaves nothing the next one does not remove, and the same export run again finishes
what a killed one had partly moved in (or finds it all there, by the origin its lcft.json records, building
nothing); and the bytes such an export writes (its disk-full message)."""

from __future__ import annotations

import contextlib
import errno
import filecmp
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lcft.checkpoint.export_out import (
    EXPORT_RECORD,
    Origin,
    check_export_out,
    export_origin,
    export_record,
    foreign_file,
    holds_this_export,
)
from lcft.checkpoint.hf_folder import (
    add_meta,
    move_model_files,
    read_config,
    save_pretrained,
    write_model_folder,
)
from lcft.checkpoint.layout import EXPORT_WORK, MODEL_CONFIG, CheckpointChanged, unchanged
from lcft.checkpoint.model_files import is_sharded_checkpoint, sharded_weight_files, weights_dtype
from lcft.checkpoint.reader import Loaded
from lcft.disk import disk_full_error, free_bytes, rename_refused
from lcft.errors import LcftError
from lcft.files import remove, temp_name
from lcft.folder_lock import LOCK_NAME, folder_lock
from lcft.model.hf_params import MAX_SHARD_BYTES, shards

BUILD = EXPORT_WORK  # in the locked folder: the model folder being built, moved to --out once complete


def _already_published(build: Path, out: Path) -> bool:
    """Whether `out` holds all of the export just built in `build`. Each of its files (lock and work folder aside)
    must be one of the export's, byte for byte: moved in by an earlier run of this export (False when some are
    missing: this run moves all in again, config.json last). `out` holding any other file is refused, unchanged."""
    theirs = {p.name for p in out.iterdir()} - {LOCK_NAME, BUILD}
    ours = {p.name for p in build.iterdir()}
    for name in sorted(theirs):
        if name not in ours or (out / name).is_symlink() or not _same_bytes(out / name, build / name):
            raise foreign_file(out, name)
    return theirs == ours


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether the files `a` and `b` hold the same bytes (False where one cannot be read)."""
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def export_model(source: Loaded, out: str | os.PathLike, *, dtype: torch.dtype | None = None, force: bool = False,
                 max_shard_size: int = MAX_SHARD_BYTES) -> tuple[Path, bool]:
    """Write the model of `source` (lcft.checkpoint.load(path, materialize=False)) to `out` as an HF folder,
    keeping the tokenizer spec it records, with the tokenizer files (tokenizer.json + config: AutoTokenizer
    encodes DNA to the model's ids; lcft.genomics.hf_tokenizer.checkpoint_tokenizer), its generation_config.json
    byte for byte where it has one, and in lcft.json where it came from (lcft.checkpoint.export_out.export_origin).
    A sharded source is streamed (peak memory: about one output shard plus the largest tensor; the whole model is
    never in memory). A new `out` appears complete (one rename);
    into an existing one (`force`, empty, or partly published by a killed run of this export) the files are moved
    when all are written, config.json last. A full disk is a one-line error; nothing of a failed export stays.
    Returns (`out`, False when it already held all of this export: nothing was written or moved)."""
    out = Path(out)
    asked = str(dtype).removeprefix("torch.") if dtype is not None else None
    origin: Origin = functools.cache(lambda: export_origin(source.path, asked, source.identity))
    if check_export_out(out, source.path, force, origin):
        return out, False
    if source.model is None:
        raise ValueError("export_model needs the source's model: load(path, materialize=False)")
    from lcft.genomics.hf_tokenizer import checkpoint_tokenizer

    # the tokenizer lcft.json records, checked against the folder's tokenizer.json and the embedding's rows
    with unchanged(source.path, source.identity):
        tokenizer = checkpoint_tokenizer(source.path, source.tokenizer, source.model.config.vocab_size)
        origin()  # the source's content as the model was read (a run pruning it meanwhile: one line)
    failed: tuple[Exception, int | None] | None = None
    written = True
    # again under the lock, before anything there changes: another writer may have been first
    with _work_folder(out, lambda: not holds_this_export(out, force, origin)) as build:
        if build is None:
            return out, False
        try:  # a sharded source is read as written: removed or replaced meanwhile (a run pruning it), one line
            with unchanged(source.path, source.identity) if source.sharded else contextlib.nullcontext():
                _write(source, build, dtype, max_shard_size, tokenizer)
                add_meta(build, {EXPORT_RECORD: export_record(origin(), build)})
        except CheckpointChanged:
            raise
        except Exception as e:
            failed = e, free_bytes(build)  # before the partial files' space comes back
        else:
            written = force or build.parent != out or not _already_published(build, out)
            if written:
                _publish(build, out)
    if failed is not None:
        err = disk_full_error(failed[0], out, export_bytes(source.path, dtype), failed[1])
        if err is None:
            raise failed[0]
        raise LcftError(f"cannot export to {out}: {err}") from None
    return out, written


def _write(source: Loaded, build: Path, dtype: torch.dtype | None, max_shard_size: int, tokenizer: Any) -> None:
    """The model folder of `source` written into the empty folder `build`, with the model tokenizer `tokenizer`'s
    files and the source's generation_config.json as read (`Loaded.generation`)."""
    if not source.sharded:
        save_pretrained(source.model, build, dtype=dtype, tokenizer=source.tokenizer, hf_tokenizer=tokenizer,
                        generation=source.generation)
        return
    from lcft.checkpoint.dcp import check_sharded_readable, read_tensors  # (torch.distributed: sharded only)

    stored = check_sharded_readable(source.path)  # weights of one dtype, the one written
    model = source.model  # on the meta device: names, shapes and the shard plan; no storage
    files = shards(model, dtype or stored, max_shard_size, read=lambda names: read_tensors(source.path, names))
    write_model_folder(build, model.config, files, dtype or stored, source.tokenizer, hf_tokenizer=tokenizer,
                       generation=source.generation)


@contextlib.contextmanager
def _work_folder(out: Path, admit: Callable[[], bool]) -> Iterator[Path | None]:
    """An empty folder to build the export of `out` in, held under a lock: `out`'s own when it exists (the lock
    every lcft writer takes), else that of its hidden sibling '.NAME.tmp' (so `out` itself appears only
    complete); None, nothing changed, when `admit()`, asked first under the lock, says no export is to be built
    (or raises: refused). What a killed export left there (its partial files, the writers' temp files) is removed
    first; the work folder, and the sibling, when the block ends. The work folder is kept, emptied, while it marks
    files of an export not all moved in (`_half_published`: config.json comes last), until an export completes
    them: readers say so, and the same export run again takes them for its own (`export_out.maybe_exported`). A
    sibling that an export of a new `out` left, killed once it had renamed its work folder to `out`, goes at the
    start."""
    holder, held = (out if out.is_dir() else temp_name(out)), False
    if holder == out:
        _remove_sibling(out)
    try:
        with folder_lock(holder, "lcft export", shown=out):
            held = True
            if not admit():
                yield None
                return
            build = holder / BUILD
            marks = build.is_dir() and _half_published(holder)
            _empty(build)  # existing: the writers put their temp files inside it, never beside it
            try:
                yield build
            finally:
                if marks and _half_published(holder):
                    _empty(build)
                else:
                    remove(build)
    finally:
        if held and holder != out:  # (never the sibling of an export this one was refused by)
            with contextlib.suppress(OSError):
                holder.rmdir()  # also the sibling a killed export left (the lock removes only one it made)


def _half_published(folder: Path) -> bool:
    """Whether `folder` holds files (lock and work folder aside) but no config.json, the file an export moves in
    last."""
    return not (folder / MODEL_CONFIG).exists() and bool({p.name for p in folder.iterdir()} - {LOCK_NAME, BUILD})


def _publish(build: Path, out: Path) -> None:
    """The complete folder `build` becomes `out`: its files moved into `out` when that existed (under its lock),
    else renamed to it in one step."""
    if build.parent == out:
        move_model_files(build, out)
        return
    try:
        os.replace(build, out)  # over nothing, or over an empty folder made meanwhile
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise LcftError(f"another writer created {out} during this export; nothing was written to it") from None
        raise LcftError(f"cannot export to {out}: {rename_refused(e, out.parent) or e.strerror or e}") from None


def _remove_sibling(out: Path) -> None:
    """The hidden sibling of the existing `out` that a killed export of a new `out` held its work folder in (the
    lock file, maybe a partial work folder): removed when no export holds its lock, and only those."""
    sibling = temp_name(out)
    if sibling.is_dir() and not sibling.is_symlink():
        with contextlib.suppress(LcftError, OSError), folder_lock(sibling, "lcft export", shown=out):
            remove(sibling / BUILD)
            (sibling / LOCK_NAME).unlink()
            sibling.rmdir()  # fails, keeping it, when anything else is inside


def _empty(folder: Path) -> None:
    """`folder` as an empty folder, kept when it is one (its files removed), else made."""
    if folder.is_dir() and not folder.is_symlink():
        for child in folder.iterdir():
            remove(child)
    else:
        remove(folder)
        folder.mkdir()


def export_bytes(source: Path, dtype: object) -> int:
    """About the bytes an export of checkpoint folder `source` writes: its weights (safetensors or dcp/ shards),
    scaled to --dtype from the dtype they are stored in, as their headers declare it (`weights_dtype`, as the
    export's record says: of weights of several dtypes, the one holding all, so about; a sharded checkpoint's
    metadata; unscaled where that is not told)."""
    if is_sharded_checkpoint(source):
        from lcft.checkpoint.dcp import check_sharded_readable

        size = sum(f.stat().st_size for f in sharded_weight_files(source)) // 3  # weights + 2 moments
        stored: torch.dtype | None = check_sharded_readable(source)
    else:
        size = sum(f.stat().st_size for f in source.glob("model*.safetensors"))
        name = weights_dtype(source)
        stored = getattr(torch, name) if name else None
    if isinstance(dtype, torch.dtype) and stored is not None:
        size = size * dtype.itemsize // stored.itemsize
    return size


def transformers_attention_note(folder: Path) -> str | None:
    """What transformers runs of the exported model in `folder` where lcft runs other attention: a sparse model's
    class has no block-sparse attention, so transformers reads it dense (lcft.json keeps the sparse settings)."""
    cfg = read_config(folder)
    if cfg.attention.backend != "sparse":
        return None
    spec = cfg.attention.sparse
    window = f", within its sliding window of {cfg.sliding_window:,} tokens" if cfg.sliding_window else ""
    return (f"note: the model uses sparse attention ({spec.budget} blocks of {spec.block_size} tokens per query "
            f"block); transformers reads {folder} with dense attention (every earlier token{window}, as lcft's "
            f"--attention dense), so its logits are lcft's only for sequences up to {spec.budget * spec.block_size:,} "
            "tokens; lcft eval and train --init read its lcft.json and keep it sparse")
