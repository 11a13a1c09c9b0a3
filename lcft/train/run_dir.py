"""A run folder as an invocation starts: which checkpoint it continues (or none), then taking the folder over:
its lock, interrupted saves cleared, checkpoints after the resumed step superseded, changed options said."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from lcft.checkpoint.layout import RUN_CONFIG, latest_checkpoint, resolve_resume
from lcft.checkpoint.save import clean_partial, supersede_after
from lcft.config import save_resolved, to_dict
from lcft.errors import LcftError
from lcft.files import folder_lock
from lcft.shapes import check_batch, check_world
from lcft.train.config import TrainConfig, diff, load_run_config


def check_run_dir(cfg: TrainConfig, run: Path, say: Callable[[str], None]) -> Path | None:
    """The checkpoint to resume from (--resume auto passes over corrupt ones, saying so), or None for a new
    run; refuses to mix or overwrite runs. Writes nothing."""
    saved = run / RUN_CONFIG
    if cfg.resume:
        return resolve_resume(cfg.resume, run, say=say)
    if saved.is_file():
        changed = diff(load_run_config(saved).run_defining(), cfg.run_defining())
        if changed:
            raise LcftError(f"{run} holds a run with a different config ({'; '.join(changed[:4])}); "
                            "pass --resume auto to continue it with these options, or choose another --out")
    if (ckpt := latest_checkpoint(run)) is not None:
        raise LcftError(f"{run} already holds checkpoints (latest {ckpt.name}); pass --resume auto to "
                        "continue that run, or choose another --out")
    return None


def check_launch(cfg: TrainConfig, world: int) -> None:
    """What a launch of `world` processes checks before it creates anything: the world splits into
    context-parallel groups and the batch into data-parallel replicas."""
    check_batch(cfg.global_batch, cfg.micro_batch, check_world(world, cfg.cp))


def check_run_folder(cfg: TrainConfig) -> None:
    """A launch's check, under its lock, that the run folder takes this run (rank 0 then says what it finds)."""
    check_run_dir(cfg, Path(cfg.out), lambda _message: None)


def open_run_dir(cfg: TrainConfig, run: Path, resume_step: int | None, lock: contextlib.ExitStack,
                 say: Callable[[str], None]) -> None:
    """Rank 0 takes the run folder: its lock (held until `lock` closes; a second writer is refused, naming this
    pid), temp folders of interrupted saves removed; on a resume the checkpoints after `resume_step` moved to
    superseded/ (the resumed run owns those steps) and changed options reported; then the resolved config."""
    lock.enter_context(folder_lock(run, "lcft train"))
    clean_partial(run)
    if resume_step is not None:
        for moved in supersede_after(run, resume_step):
            say(f"{moved.name} is after the resumed step {resume_step}: moved to {moved}")
        if (run / RUN_CONFIG).is_file():
            changed = diff(load_run_config(run / RUN_CONFIG).run_defining(), cfg.run_defining())
            if changed:
                say(f"resuming with changed options: {'; '.join(changed)} (they apply from the next step; "
                    "the schedule continues from its position)")
    save_resolved(run / RUN_CONFIG, to_dict(cfg))
