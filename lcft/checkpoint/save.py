"""Writing checkpoints: atomic folders (temp folder, then rename) with checksums, pruning, partial-save
cleanup, superseding the checkpoints after a resume point. The folder layout (and finding a run's checkpoints)
is lcft.checkpoint.layout's; the trainer state in it, lcft.checkpoint.state's."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lcft.checkpoint.layout import (
    CHECKSUMS,
    SUPERSEDED,
    TMP_PREFIX,
    checkpoints_dir,
    latest_checkpoint,
    list_checkpoints,
    step_name,
    verify_checkpoint,
)
from lcft.disk import disk_full_error, free_bytes, kept_space, remove_tree, removed_or_said, write_failure
from lcft.errors import LcftError
from lcft.files import atomic_write
from lcft.hashing import file_record

PRUNED = TMP_PREFIX + "pruned-"  # a pruned checkpoint's folder while it is deleted
LATER = " (the run's next start tries again)"  # a temp folder left: clean_partial's

if TYPE_CHECKING:  # only a type here: the run folder's checks (lcft.train.run_dir) import this module without torch
    import torch


def clean_partial(run_dir: str | os.PathLike, warn: Callable[[str], None] | None = None) -> list[Path]:
    """Remove temp folders left by saves that were interrupted (crash, SIGKILL) and by prunes; returns what was
    removed. One that cannot be removed is a warning to `warn`: it keeps its disk space."""
    root = checkpoints_dir(run_dir)
    removed = []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if p.name.startswith(TMP_PREFIX) and removed_or_said(p, warn, f"{p}, left by an earlier save or prune"):
                removed.append(p)
    return removed


def prune(run_dir: str | os.PathLike, keep_last: int, warn: Callable[[str], None] | None = None) -> None:
    """Delete all but the newest `keep_last` checkpoints (0 = keep all); the newest checkpoint that verifies is
    kept even when older than those (so a run always keeps one good checkpoint to resume from). A checkpoint
    that cannot be deleted is a warning to `warn` (the run goes on); each later prune tries it again."""
    if keep_last <= 0:
        return
    root = checkpoints_dir(run_dir)
    for p in sorted(root.glob(PRUNED + "*")):  # an earlier prune's, warned of then: its space back once it goes
        remove_tree(p)
    found = list_checkpoints(run_dir)
    doomed, kept = found[:-keep_last], found[-keep_last:]
    if doomed and not any(_verifies(p) for _, p in reversed(kept)):
        good = next((i for i in range(len(doomed) - 1, -1, -1) if _verifies(doomed[i][1])), None)
        if good is not None:
            doomed.pop(good)
    for _, p in doomed:
        if (why := remove_checkpoint(p)) is not None and warn is not None:
            warn(kept_space(f"the pruned checkpoint {why}", " (each later save and the run's next start try again)"))


def remove_checkpoint(ckpt: Path) -> str | None:
    """Delete the checkpoint folder `ckpt`: renamed to a temp name first, so a kill midway leaves a temp folder
    that the next start's clean_partial removes, never a partly deleted folder under its step name (where a
    reader, or --resume naming it, found files missing). Returns what stays and why ("FOLDER: WHY"), or None."""
    doomed = ckpt.with_name(PRUNED + ckpt.name)
    remove_tree(doomed)
    try:
        os.rename(ckpt, doomed)
    except OSError:
        doomed = ckpt  # (gone already, or a folder we may not rename: removed where it is, as before)
    why = remove_tree(doomed)
    return None if why is None else f"{doomed}: {why}"


_WRITTEN: set[Path] = set()  # checkpoints this process hashed as it wrote them: not read back to prune


def _verifies(ckpt: Path) -> bool:
    if ckpt in _WRITTEN and ckpt.is_dir():
        return True
    try:
        return verify_checkpoint(ckpt)
    except LcftError:
        return False


def supersede_after(run_dir: str | os.PathLike, step: int) -> list[tuple[str, Path]]:
    """Move the run's checkpoints of steps after `step` to <run>/superseded/ (a run resumed from `step` owns
    every later step: those belong to the earlier trajectory); returns each one's folder name and new path (the
    name suffixed .1, .2, ... where superseded/ holds that step already)."""
    moved = []
    for s, p in list_checkpoints(run_dir):
        if s > step:
            dest = Path(run_dir) / SUPERSEDED / p.name
            n = 1
            while dest.exists():
                dest, n = dest.with_name(f"{p.name}.{n}"), n + 1
            dest.parent.mkdir(exist_ok=True)
            os.rename(p, dest)
            moved.append((p.name, dest))
    return moved


def write_checksums(folder: Path) -> None:
    """The checksums file (CHECKSUMS): size and sha256 of every file under `folder` (written last: its presence and match mean
    the checkpoint is whole)."""
    files = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.name != CHECKSUMS:
            files[f.relative_to(folder).as_posix()] = file_record(f)
    atomic_write(folder / CHECKSUMS, json.dumps({"files": files}, indent=1) + "\n")


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(p: Path) -> None:
    """Flush the folder `p`'s entries (a rename in it) to disk. A file system that cannot sync a folder (fsync of
    its descriptor fails with EINVAL or EBADF: some network and FUSE file systems, as PostgreSQL also allows) keeps
    the rename as durable as it makes it: every save had failed there."""
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _put_in_place(tmp: Path, final: Path, step: int, warn: Callable[[str], None] | None) -> None:
    """Rename the written `tmp` to `final`; a `final` there (a resumed run replaces what it recomputed) is renamed
    aside first and removed after. A file system that will not rename the folder (gcsfuse on a flat bucket: EMFILE
    past --rename-dir-limit, 0 by default) is one line, `final` left as it was and `tmp` removed: every save had
    ended the run with the OS's error, gcsfuse's a misleading 'Too many open files'."""
    root, old, aside = final.parent, None, None
    try:
        if final.exists():  # a fresh empty name to rename onto (an earlier one's copy that stayed is apart)
            old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-{final.name}-", dir=root))
            os.rename(final, old)
            aside = old
        os.rename(tmp, final)
    except OSError as e:
        if aside is not None:  # back, as the file system renamed it a moment ago
            os.rename(aside, final)
        elif old is not None:
            old.rmdir()  # the empty name made to rename onto
        removed_or_said(tmp, warn, f"the unsaved {tmp}", LATER)
        hint = ("; gcsfuse renames a folder only under its --rename-dir-limit (0 by default), so a checkpoint "
                "needs a bucket with hierarchical namespace or a higher limit") if e.errno == errno.EMFILE else ""
        raise LcftError(f"cannot save step {step}: cannot rename the written {tmp.name} to {final.name} in {root}: "
                        f"{write_failure(e)}{hint}") from None
    if old is not None:
        removed_or_said(old, warn, f"the replaced checkpoint {old}", LATER)


def checkpoint_bytes(model: torch.nn.Module) -> int:
    """About the bytes a checkpoint of `model` takes: its weights and AdamW's two moments (whole tensors: a
    sharded model's DTensors count at their global size, what all ranks write together)."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


def write_checkpoint(run_dir: str | os.PathLike, step: int, write_model: Callable[[Path], None],
                     write_rest: Callable[[Path], None],
                     between: Callable[[int, Path], None] | None = None, expected_bytes: int | None = None,
                     warn: Callable[[str], None] | None = None) -> Path:
    """Write `<run>/checkpoints/.tmp-step-N/` with its checksums, flush it to disk, then rename it to `step-N`
    (atomic on POSIX; an existing `step-N` is replaced). A crash at any point leaves either no new `step-N` or a
    complete one; earlier checkpoints are untouched. A failed write (e.g. disk full: a one-line error naming the
    folder and `expected_bytes`) removes the temp folder. `between(step, tmp)` runs after the model is written
    and before the rest (TrainHooks.during_save). A temp folder, or a replaced step's old copy, that cannot be
    removed is a warning to `warn` (its disk space stays in use; the run's next start tries again)."""
    root = checkpoints_dir(run_dir)
    final = root / step_name(step)
    tmp = root / (TMP_PREFIX + step_name(step))
    if (why := remove_tree(tmp)) is not None:  # an earlier save's, which the run's start warned of
        raise LcftError(f"cannot save step {step}: cannot remove {tmp}, left by an earlier save: {why}")
    try:  # a checkpoints folder the run may not write in (read-only, or made so): one line before anything
        tmp.mkdir(parents=True)
    except OSError as e:
        raise LcftError(f"cannot save step {step}: cannot write to {root}: {e.strerror or e}") from None
    try:
        write_model(tmp)
        if between is not None:
            between(step, tmp)
        write_rest(tmp)
        write_checksums(tmp)
        _fsync_tree(tmp)
    except Exception as e:
        free = free_bytes(root)  # before the temp folder's space comes back
        removed_or_said(tmp, warn, f"the failed save's {tmp}", LATER)
        err = disk_full_error(e, root, expected_bytes, free)
        if err is None:
            raise
        last = latest_checkpoint(run_dir)
        kept = f"; the last good checkpoint {last} is kept" if last is not None else ""
        raise LcftError(f"cannot save step {step}: {err}{kept}") from None
    _put_in_place(tmp, final, step, warn)
    _fsync_dir(root)
    _WRITTEN.add(final)
    return final

