"""Writing checkpoints: atomic folders (temp folder, then rename) with checksums, pruning, partial-save
cleanup, superseding the checkpoints after a resume point. The folder layout (and finding a run's checkpoints)
is lcft.checkpoint.layout's; the trainer state in it, lcft.checkpoint.state's."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lcft.checkpoint.layout import (
    CHECKSUMS,
    STEP_DIR,
    SUPERSEDED,
    TMP_PREFIX,
    checkpoints_dir,
    latest_checkpoint,
    list_checkpoints,
    step_name,
    verify_checkpoint,
)
from lcft.disk import (
    disk_full_error,
    free_bytes,
    kept_space,
    remove_tree,
    removed_or_said,
    rename_refused,
    write_failure,
)
from lcft.errors import LcftError
from lcft.files import atomic_write
from lcft.hashing import file_record

PRUNED = TMP_PREFIX + "pruned-"  # a pruned checkpoint's folder while it is deleted
OLD = TMP_PREFIX + "old-"  # OLD + "STEP-xxxxxxxx": a replaced checkpoint's folder while a save puts the new one in place
PUT_BACK = ".put-back-"  # PUT_BACK + "STEP-xxxxxxxx": an empty file marking that folder as the only copy of STEP
LATER = " (the run's next start tries again)"  # a temp folder left: clean_partial's

if TYPE_CHECKING:  # only a type here: the run folder's checks (lcft.train.run_dir) import this module without torch
    import torch


def clean_partial(run_dir: str | os.PathLike, warn: Callable[[str], None] | None = None) -> list[Path]:
    """Remove temp folders left by saves that were interrupted (crash, SIGKILL) and by prunes; returns what was
    removed. One that cannot be removed is a warning to `warn`: it keeps its disk space. A replaced checkpoint that
    a failed save could not put back (_put_back_replaced) is put back, or kept and said, never removed."""
    root = checkpoints_dir(run_dir)
    removed = []
    if root.is_dir():
        kept = _put_back_replaced(root, warn)
        for p in sorted(root.iterdir()):
            if p.name.startswith(TMP_PREFIX) and p not in kept \
                    and removed_or_said(p, warn, f"{p}, left by an earlier save or prune"):
                removed.append(p)
    return removed


def _put_back_replaced(root: Path, warn: Callable[[str], None] | None) -> set[Path]:
    """Each replaced checkpoint in `root` that a failed save could not rename back (its mark PUT_BACK + the
    name after OLD: the only copy of that step) renamed back under its name now; one that still cannot be is
    kept and said. A mark whose copy is gone, or whose step has a folder again (put back by hand), goes (the
    copy then a leftover to remove). Returns the copies kept."""
    kept = set()
    for mark in sorted(root.glob(PUT_BACK + "*")):
        rest = mark.name.removeprefix(PUT_BACK)
        name, old = rest.rpartition("-")[0], root / (OLD + rest)
        final = root / name
        if STEP_DIR.fullmatch(name) and old.is_dir() and not old.is_symlink() and not os.path.lexists(final):
            try:
                os.rename(old, final)
            except OSError as e:
                kept.add(old)
                if warn is not None:
                    warn(f"warning: the replaced {name} is at {old}: {_back_by_hand(e, final)}")
                continue
            if warn is not None:
                warn(f"{name}, replaced by a save that failed, is back in place")
        mark.unlink(missing_ok=True)
    return kept


def _back_by_hand(e: OSError, final: Path) -> str:
    """What to do with a replaced checkpoint that could not be renamed back to `final` (why: `e`)."""
    return (f"cannot rename it back ({write_failure(e)}); copy or move it to {final} (the run's next start "
            "tries again)")


# checkpoints this process hashed as it wrote them, while they stand: not read back to prune (one leaves as it is
# removed, so a run of many saves holds no more than it keeps)
_WRITTEN: set[Path] = set()


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
    _WRITTEN.discard(ckpt)
    doomed = ckpt.with_name(PRUNED + ckpt.name)
    remove_tree(doomed)
    try:
        os.rename(ckpt, doomed)
    except OSError:
        doomed = ckpt  # (gone already, or a folder we may not rename: removed where it is, as before)
    why = remove_tree(doomed)
    return None if why is None else f"{doomed}: {why}"


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
    name suffixed .1, .2, ... where superseded/ holds that step already). A rename that fails puts back those
    moved before it (and removes superseded/ when made here and left empty): the run folder as it was, or a
    message naming what stays where; one the file system refuses (rename_refused) is one line."""
    run, moved = Path(run_dir), []
    sup, made = run / SUPERSEDED, not os.path.lexists(run / SUPERSEDED)
    for s, p in list_checkpoints(run_dir):
        if s > step:
            dest = sup / p.name
            n = 1
            while dest.exists():
                dest, n = dest.with_name(f"{p.name}.{n}"), n + 1
            sup.mkdir(exist_ok=True)
            try:
                os.rename(p, dest)
            except OSError as e:
                stays = _move_back(moved, p.parent, sup if made else None)
                if (why := rename_refused(e, run)) is None:
                    raise
                raise LcftError(f"cannot resume from step {step}: cannot move {p} to {sup}: {why}{stays}") from None
            moved.append((p.name, dest))
    return moved


def _move_back(moved: list[tuple[str, Path]], root: Path, made: Path | None) -> str:
    """The checkpoints `moved` (name, where) renamed back into `root`, and the folder `made` removed when empty;
    '' when all are back, else the message's tail naming those that stay."""
    stays = []
    for name, dest in reversed(moved):
        try:
            os.rename(dest, root / name)
        except OSError:
            stays.append(f"{dest} (copy or move it back to {root / name})")
    if made is not None and not stays:
        with contextlib.suppress(OSError):
            made.rmdir()
    return f"; moved already and not put back: {', '.join(reversed(stays))}" if stays else ""


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
    aside first and removed after. A failed rename is one line (rename_refused: a file system that will not rename
    a folder, gcsfuse on a flat bucket past --rename-dir-limit) with `tmp` removed and `final` as it was, or, where
    the replaced copy cannot be put back, the line says where it is (clean_partial then keeps it). Until the new
    step is in place the replaced one's folder is marked (PUT_BACK): a kill between the two renames leaves it for
    the next start to put back, not to remove as a temp folder (the step's only copies were both temp folders)."""
    root, old, aside, mark = final.parent, None, None, None
    try:
        if final.exists():  # a fresh empty name to rename onto (an earlier one's copy that stayed is apart)
            old = Path(tempfile.mkdtemp(prefix=f"{OLD}{final.name}-", dir=root))
            mark = root / (PUT_BACK + old.name.removeprefix(OLD))
            with contextlib.suppress(OSError):  # (unmarked, a failure's line still names it)
                mark.touch()
            os.rename(final, old)
            aside = old
        os.rename(tmp, final)
    except OSError as e:
        stays = ""
        if aside is not None:  # back, as the file system renamed it a moment ago
            try:
                os.rename(aside, final)
            except OSError as back:  # still marked: clean_partial puts it back, never removes it
                mark = None
                stays = f"; the replaced {final.name} is at {aside}: {_back_by_hand(back, final)}"
        elif old is not None:
            old.rmdir()  # the empty name made to rename onto
        _unmark(mark)
        removed_or_said(tmp, warn, f"the unsaved {tmp}", LATER)
        why = rename_refused(e, root) or (f"cannot rename the written {tmp.name} to {final.name} in {root}: "
                                          f"{write_failure(e)}")
        raise LcftError(f"cannot save step {step}: {why}{stays}") from None
    _unmark(mark)
    if old is not None:
        removed_or_said(old, warn, f"the replaced checkpoint {old}", LATER)


def _unmark(mark: Path | None) -> None:
    """The mark of a replaced checkpoint removed: it is back in place, or the new one is (then a leftover a
    failed removal keeps is removed at the next start; a mark that stays is dropped there once its step is in
    place)."""
    if mark is not None:
        with contextlib.suppress(OSError):
            mark.unlink(missing_ok=True)


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

