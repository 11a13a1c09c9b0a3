"""lcft.checkpoint.save on file systems that cannot sync or rename a folder: checkpoints are written, named and verified, or the save is one line."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from lcft.checkpoint import save
from lcft.checkpoint.layout import list_checkpoints, step_name, verify_checkpoint
from lcft.checkpoint.save import clean_partial, prune, supersede_after, write_checkpoint
from lcft.errors import LcftError
from tests.one_line import gcsfuse, refused


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EBADF])
def test_a_file_system_that_cannot_sync_a_folder_still_saves(tmp_path, monkeypatch, err):
    """fsync of a folder's descriptor failing with EINVAL or EBADF (some network and FUSE file systems; files
    sync there): each save is written, renamed and verifies; every save had failed with the OS's error, so no
    run could keep a checkpoint there. Files are still synced, and any other error of a folder's fsync (EIO) is
    still the save's failure."""
    real, synced = os.fsync, []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(err, os.strerror(err))
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = tmp_path / "run"
    for step in (1, 2, 2):  # the second step 2: a resumed run replacing what it recomputed
        write_checkpoint(run, step, lambda d, s=step: (d / "model.txt").write_text(f"step {s}"), lambda d: None)
    assert [s for s, _ in list_checkpoints(run)] == [1, 2] and synced
    assert all(verify_checkpoint(p) for _, p in list_checkpoints(run))

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output error"):
        write_checkpoint(run, 3, lambda d: (d / "model.txt").write_text("step 3"), lambda d: None)
    assert [s for s, _ in list_checkpoints(run)] == [1, 2]


def test_a_file_system_that_will_not_rename_a_folder_is_one_line(tmp_path, monkeypatch):
    """gcsfuse on a flat bucket renames a folder of more files than --rename-dir-limit (0 by default) with EMFILE
    (gcsfuse's internal/fs/fs.go; an empty folder renames): the save is one line naming the folder, the step, the
    limit and the remedy; the step's earlier checkpoint stays as it was, and no temp folder is left (every save had
    ended the run with a traceback ending in 'Too many open files')."""
    run = tmp_path / "run"
    write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("step 1"), lambda d: None)
    gcsfuse(monkeypatch, "rename")
    root = run / "checkpoints"
    for step in (2, 1):  # a new step, and step 1 again (a resumed run replacing what it recomputed)
        with pytest.raises(LcftError) as caught:
            write_checkpoint(run, step, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
        assert str(caught.value) == f"cannot save step {step}: {refused(root, errno.EMFILE)}"
        assert sorted(p.name for p in root.iterdir()) == [step_name(1)]
    assert (root / step_name(1) / "model.txt").read_text() == "step 1" and verify_checkpoint(root / step_name(1))


def test_a_failed_rename_of_the_new_checkpoint_puts_the_replaced_one_back(tmp_path, monkeypatch):
    """Where only the second rename fails (the old copy already aside), the old copy comes back under its name."""
    run = tmp_path / "run"
    write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("step 1"), lambda d: None)
    real = os.rename

    def refuse_temp(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if os.path.basename(src).startswith(".tmp-step-"):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real(src, dst)

    monkeypatch.setattr(os, "rename", refuse_temp)
    with pytest.raises(LcftError, match="Invalid cross-device link"):
        write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [step_name(1)]
    assert (root / step_name(1) / "model.txt").read_text() == "step 1" and verify_checkpoint(root / step_name(1))


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("back", [True, False])
def test_a_refused_rename_while_superseding_puts_back_what_moved(tmp_path, monkeypatch, back):
    """A resume from step 2 moves steps 3 and 4 to superseded/; the file system refuses the second rename (EXDEV,
    as some FUSE mounts): one line naming it and the remedy, step 3 renamed back and superseded/ (made for it)
    removed, the run folder as it was (it was a traceback with step 3 moved and step 4 not). Where putting step 3
    back is refused too, the line names where it is."""
    run = tmp_path / "run"
    for step in (1, 2, 3, 4):
        write_checkpoint(run, step, lambda d, s=step: (d / "model.txt").write_text(f"step {s}"), lambda d: None)
    before, real = _tree(run), os.rename
    root, sup = run / "checkpoints", run / "superseded"

    def fuse(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if Path(src).name == step_name(4) or (not back and Path(src).parent == sup):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real(src, dst)

    monkeypatch.setattr(os, "rename", fuse)
    with pytest.raises(LcftError) as caught:
        supersede_after(run, 2)
    said = f"cannot resume from step 2: cannot move {root / step_name(4)} to {sup}: {refused(run, errno.EXDEV)}"
    if back:
        assert str(caught.value) == said and _tree(run) == before
    else:
        assert str(caught.value) == f"{said}; moved already and not put back: {sup / step_name(3)} (copy or move " \
                                    f"it back to {root / step_name(3)})"
        assert sorted(p.name for p in root.iterdir()) == [step_name(s) for s in (1, 2, 4)]
        assert (sup / step_name(3) / "model.txt").read_text() == "step 3" and verify_checkpoint(sup / step_name(3))


def test_a_replaced_step_that_cannot_be_put_back_is_named_and_kept(tmp_path, monkeypatch):
    """Saving step 1 again where the file system renames the old copy aside but then refuses both the new copy
    and putting the old one back: one line naming where the old copy is (it was a traceback, and the run's next
    start removed that copy, the step's only one, as a temp folder). The next start puts it back; while the file
    system still refuses, it keeps it and says so."""
    run = tmp_path / "run"
    write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("step 1"), lambda d: None)
    root, real = run / "checkpoints", os.rename
    final = root / step_name(1)

    def fuse(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if Path(dst) == final:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        real(src, dst)

    monkeypatch.setattr(os, "rename", fuse)
    with pytest.raises(LcftError) as caught:
        write_checkpoint(run, 1, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
    [old] = root.glob(".tmp-old-*")
    eperm = f"{os.strerror(errno.EPERM)} (errno {errno.EPERM})"
    assert str(caught.value) == (f"cannot save step 1: {refused(root, errno.EPERM)}; the replaced {step_name(1)} is "
                                 f"at {old}: cannot rename it back ({eperm}); copy or move it to {final} (the run's "
                                 "next start tries again)")
    assert (old / "model.txt").read_text() == "step 1" and not (root / f".tmp-{step_name(1)}").exists()
    said: list[str] = []
    assert clean_partial(run, said.append) == [] and old.is_dir()
    assert said == [f"warning: the replaced {step_name(1)} is at {old}: cannot rename it back ({eperm}); copy or "
                    f"move it to {final} (the run's next start tries again)"]
    monkeypatch.setattr(os, "rename", real)
    said.clear()
    assert clean_partial(run, said.append) == [] and said == [f"{step_name(1)}, replaced by a save that failed, is back in place"]
    assert [p.name for p in root.iterdir()] == [step_name(1)] and (final / "model.txt").read_text() == "step 1"
    assert verify_checkpoint(final)


class Killed(BaseException):
    """A SIGKILL at this point: nothing after it runs, no handler of the save's."""


def test_a_save_killed_between_its_two_renames_keeps_the_step(tmp_path, monkeypatch):
    """A resumed run re-saving step 2 is killed after the old step-2 was renamed aside and before the new one took
    its name: the next start puts the old one back (both copies were temp folders, which it removed: step 2 was
    lost); killed after both renames, the new one stays and the old one goes."""
    run = tmp_path / "run"
    for step in (1, 2):
        write_checkpoint(run, step, lambda d, s=step: (d / "model.txt").write_text(f"step {s}"), lambda d: None)
    real, root = os.rename, run / "checkpoints"

    def killed_before_the_new_one(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if Path(src).name.startswith(".tmp-step-"):
            raise Killed
        real(src, dst)

    monkeypatch.setattr(os, "rename", killed_before_the_new_one)
    with pytest.raises(Killed):
        write_checkpoint(run, 2, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
    monkeypatch.setattr(os, "rename", real)
    assert step_name(2) not in os.listdir(root)
    said: list[str] = []
    clean_partial(run, said.append)
    assert sorted(os.listdir(root)) == [step_name(1), step_name(2)], said
    assert (root / step_name(2) / "model.txt").read_text() == "step 2" and verify_checkpoint(root / step_name(2))

    def killed_after_both(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        real(src, dst)
        if Path(dst).name == step_name(2) and Path(src).name.startswith(".tmp-step-"):
            raise Killed

    monkeypatch.setattr(os, "rename", killed_after_both)
    with pytest.raises(Killed):
        write_checkpoint(run, 2, lambda d: (d / "model.txt").write_text("again"), lambda d: None)
    monkeypatch.setattr(os, "rename", real)
    clean_partial(run, said.append)
    assert sorted(os.listdir(root)) == [step_name(1), step_name(2)], said
    assert (root / step_name(2) / "model.txt").read_text() == "again" and verify_checkpoint(root / step_name(2))


def test_a_run_of_many_saves_remembers_only_the_checkpoints_it_keeps(tmp_path, monkeypatch):
    """What this process wrote is trusted by a prune without hashing it again: after 20 saves, each pruned to the
    last 2, that trust is held for those 2 only (it grew by one path per save, for the whole run), and no prune
    read a checkpoint back."""
    verified = []
    monkeypatch.setattr(save, "verify_checkpoint", lambda ckpt: verified.append(ckpt) or verify_checkpoint(ckpt))
    run = tmp_path / "run"
    for step in range(1, 21):
        write_checkpoint(run, step, lambda d, s=step: (d / "model.txt").write_text(f"step {s}"), lambda d: None)
        prune(run, 2)
    kept = {p for _, p in list_checkpoints(run)}
    assert [s for s, _ in list_checkpoints(run)] == [19, 20] and verified == []
    assert {p for p in save._WRITTEN if p.is_relative_to(run)} == kept
