"""A run folder as an invocation starts: which checkpoint it continues (or none), then taking the folder over:
its lock, interrupted saves cleared, checkpoints after the resumed step superseded, changed options and changed
data said."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcft.checkpoint.layout import (
    RUN_CONFIG,
    SUPERSEDED,
    check_output_folder,
    latest_checkpoint,
    locate_checkpoint,
    resolve_resume,
)
from lcft.checkpoint.save import clean_partial, supersede_after
from lcft.config_toml import save_resolved, to_dict
from lcft.console import say_on_stderr
from lcft.disk import write_faults
from lcft.errors import LcftError, shown
from lcft.files import present
from lcft.foreign_entries import refuse_not_own
from lcft.genomics.shards import read_manifest, windows_identity
from lcft.hub import hub_id
from lcft.parallel.config import SPLIT_OPTIONS
from lcft.parallel.same_run import checkpoint_identity, content_identity, fingerprint
from lcft.shapes import check_batch, check_world
from lcft.train.config import ModelOverrides, TrainConfig, diff, load_run_config

if TYPE_CHECKING:
    from lcft.checkpoint.state import TrainerState

METRICS = "metrics.jsonl"  # in the run folder: one JSON line per step
SUMMARY = "summary.json"  # in the run folder: how the latest invocation ended
# Options a resume ignores: the model is the checkpoint's; they only choose where a new run starts from.
IGNORED_ON_RESUME = ("init", "preset")
# The model overrides a resume leaves unset (None: the model's own) keep the checkpoint's model, whose values the
# run gave them: they stay the run's (not named as changed, and the configs saved still record them).
KEPT_WHEN_UNSET = tuple(f.name for f in dataclasses.fields(ModelOverrides) if f.name not in IGNORED_ON_RESUME)


def check_run_dir(cfg: TrainConfig, run: Path, say: Callable[[str], None],
                  before_choice: Callable[[], None] | None = None) -> Path | None:
    """The checkpoint to resume from (--resume auto passes over corrupt ones, saying so), or None for a new
    run; refuses to mix or overwrite runs (a folder without checkpoints holds nothing to lose: a new run with
    other options may start there), or to write a run into --data, a model folder or a checkpoint. Writes nothing
    itself; `before_choice` runs once the folder passed these checks, before the checkpoint is chosen (the
    trainer's: a step a failed save left aside is put back there, so --resume auto can choose it)."""
    check_output_folder(run, "the run", ("run",), data=cfg.data)
    # read, appended to or replaced later: a FIFO would hang, a folder fail, a link be written through (or, dangling,
    # fail after the folder is taken)
    for name in (RUN_CONFIG, METRICS, SUMMARY):
        refuse_not_own(run / name, "train")
    # a resume renames the checkpoints after its step into it: a link would move them out of the run folder
    refuse_not_own(run / SUPERSEDED, "train", folder=True)
    if before_choice is not None:
        before_choice()
    if cfg.resume:
        ckpt = resolve_resume(cfg.resume, run, say=say)
        check_same_run(ckpt, run)
        check_steps_ahead(cfg.steps, ckpt, run)
        return ckpt
    if (ckpt := latest_checkpoint(run)) is None:
        return None
    if changed := changed_options(cfg, run):
        raise LcftError(f"{run} holds a run with a different config ({'; '.join(changed[:4])}); "
                        "pass --resume auto to continue it with these options, or choose another --out")
    raise LcftError(f"{run} already holds checkpoints (latest {ckpt.name}); pass --resume auto to "
                    "continue that run, or choose another --out")


def changed_options(cfg: TrainConfig, run: Path) -> list[str]:
    """The run-defining options (each "name: saved -> given") in which `cfg`, its folders absolute, differs from
    the config saved in `run` (a run folder, or a checkpoint: the config it was trained with); none when it
    holds none."""
    saved = run / RUN_CONFIG
    return diff(load_run_config(saved).run_defining(), cfg.run_defining()) if saved.is_file() else []


def check_same_run(ckpt: Path, run: Path) -> None:
    """A resume of a checkpoint from outside the run folder starts a run there from it: refused when the folder
    holds checkpoints, which are another run's (its steps up to the resumed one would stay, the later ones be
    superseded, and the two runs' checkpoints and metrics mixed in one folder)."""
    if (latest := latest_checkpoint(run)) is not None and not ckpt.resolve().is_relative_to(run.resolve()):
        raise LcftError(f"{run} holds another run's checkpoints (latest {latest.name}); --resume {ckpt} starts a "
                        "run from outside it: choose another --out, or pass --resume auto to continue that run")


def check_steps_ahead(steps: int, ckpt: Path, run: Path) -> None:
    """A resume trains the steps after its checkpoint's: refused when --steps is below that step, or at it for any
    checkpoint but the run's latest: into another run folder it would end with no checkpoint of its own, from an
    earlier one of the run it would train nothing yet supersede the later ones. The run's latest step again is a
    finished run started once more: nothing to train, and it ends as done."""
    # imported here: it imports torch, which a resume loads anyway and the checks without one never need
    from lcft.checkpoint.state import checkpoint_step

    step = checkpoint_step(ckpt)
    latest = latest_checkpoint(run)
    if steps < step or (steps == step and (latest is None or ckpt.resolve() != latest.resolve())):
        raise LcftError(f"--steps {steps} is not past the checkpoint's step {step} ({ckpt}); raise --steps")


def keep_resumed_model(cfg: TrainConfig, ckpt: Path, say: Callable[[str], None]) -> TrainConfig:
    """`cfg` with the options a resume ignores (IGNORED_ON_RESUME), and the model overrides it leaves unset
    (KEPT_WHEN_UNSET), set back to the resumed run's own (from the checkpoint's config.toml), so the configs saved
    from now on still describe the model; values given other than the run's and the defaults are named as
    ignored, in one line with what the run started from."""
    saved = ckpt / RUN_CONFIG
    if not present(saved):
        return cfg
    run = load_run_config(saved)
    kept = {k: getattr(run, k) for k in IGNORED_ON_RESUME}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name in IGNORED_ON_RESUME}
    ignored = [f"--{k} {getattr(cfg, k)!r}" for k in IGNORED_ON_RESUME if getattr(cfg, k) not in (kept[k], defaults[k])]
    if ignored:
        # a run given --init never used its preset (saved all the same, as the default): name what it did use
        origin = f"--init {run.init!r}" if run.init is not None else f"--preset {run.preset!r}"
        say(f"ignored with --resume (the model is the checkpoint's, from a run started with {origin}): "
            f"{'; '.join(ignored)}")
    unset = {k: getattr(run, k) for k in KEPT_WHEN_UNSET if getattr(cfg, k) is None}
    return dataclasses.replace(cfg, **kept, **unset)


def data_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What identifies the training windows of a prepared data folder (windows_identity of its train split)."""
    return windows_identity(manifest, "train")


def same_run(cfg: TrainConfig) -> dict[str, str]:
    """This rank's fingerprint of the run (lcft.parallel.same_run): its options as the run takes them
    (`taken_options`), and what --data (its training windows), --init (unless a resume ignores it) and the checkpoint
    it resumes hold."""
    resumed = resumed_checkpoint(cfg)
    inputs = {"data": content_identity(lambda: data_identity(read_manifest(cfg.data))),
              "init": checkpoint_identity(None if cfg.resume else cfg.init),
              "resume": checkpoint_identity(str(resumed) if resumed is not None else cfg.resume)}
    return fingerprint(taken_options(cfg, resumed), inputs)


def resumed_checkpoint(cfg: TrainConfig) -> Path | None:
    """The checkpoint a resume continues, as this node finds it now, unverified (its checksums identify it; the job
    verifies what it resumes, and hashing every weight here too would read a large checkpoint twice at each start):
    --resume auto's newest, else the checkpoint the folder given names; None without --resume or where none is
    found (the job then says why)."""
    if not cfg.resume:
        return None
    try:
        if cfg.resume == "auto":
            return latest_checkpoint(cfg.out)
        return locate_checkpoint(cfg.resume, weights=False)
    except (LcftError, OSError):
        return None


def taken_options(cfg: TrainConfig, resumed: Path | None) -> dict[str, Any]:
    """`cfg`'s options (to_dict) as the run takes them, so that one run given two ways is one fingerprint: --preset
    left out where the model is a checkpoint's (ignored there); the model's attention and RoPE options as the model
    trained has them (taken_overrides: one left unset as the model's own, RoPE scaling as the model's config holds
    it); an unset --seq-len as the data's window length; --precision auto as what this node picks; --stop-after as
    the run takes it after the checkpoint it resumes (TrainConfig.stops_after); the window split's options left out
    with cp 1 (none is split).
    What cannot be read leaves its options as given (the job names it)."""
    # imported here: torch, which the fingerprint's process has loaded and the run folder's checks never need
    import torch

    from lcft.checkpoint.state import checkpoint_step
    from lcft.train.model_setup import taken_overrides
    from lcft.train.precision import choose_precision

    options = to_dict(cfg)
    options["precision"] = choose_precision(cfg.precision, not torch.cuda.is_available())[0]
    start = 0  # the steps left after the checkpoint it resumes are what --stop-after is compared with
    with contextlib.suppress(LcftError, OSError):
        start = checkpoint_step(resumed) if cfg.resume and resumed is not None else 0
    options["stop_after"] = cfg.stops_after(start)
    with contextlib.suppress(LcftError, OSError):
        options["seq_len"] = cfg.seq_len or data_identity(read_manifest(cfg.data))["length"]
    if cfg.resume or cfg.init:
        del options["preset"]
    if cfg.cp == 1:
        options = {k: v for k, v in options.items() if k not in SPLIT_OPTIONS}
    with contextlib.suppress(LcftError, OSError):
        source = resumed if cfg.resume else None if cfg.init is None or hub_id(cfg.init) is not None else \
            locate_checkpoint(cfg.init, weights=False)
        if source is not None or not (cfg.resume or cfg.init):  # (a Hub id: its config is not fetched for this)
            options |= taken_overrides(cfg.model, source, cfg.preset)
    return options


def record_data(state: TrainerState, manifest: dict[str, Any]) -> list[str]:
    """Record in `state` the identity of the data this invocation trains on; returns how it differs from the
    data the resumed checkpoint recorded, as a 'data contents: ...' line (none when equal, for a new run, or for
    a checkpoint of an lcft that did not record it)."""
    saved, state.data = state.data, data_identity(manifest)
    if not isinstance(saved, dict) or saved == state.data:
        return []
    now = state.data
    # every value shown escaped: the saved ones come from a checkpoint's state.json (read_state checks their form)
    parts = [f"{k} {shown(saved.get(k))} -> {shown(now[k])}" for k in ("length", "stride") if saved.get(k) != now[k]]
    old, new = saved.get("sha256", {}), now["sha256"]
    parts += [f"{shown(name)} sha256 {_short(old.get(name))} -> {_short(new.get(name))}"
              for name in sorted({*old, *new}) if old.get(name) != new.get(name)]
    return [f"data contents: {', '.join(parts)}"]


def _short(digest: str | None) -> str:
    return shown(digest[:12]) if digest else "none"


def clear_saves(run: Path, main: bool, say: Callable[[str], None]) -> None:
    """Every rank of the run, before it chooses the checkpoint to resume (check_run_dir's `before_choice`): rank 0
    (`main`), holding the run folder's lock, removes the temp folders of interrupted saves and puts back a step
    that a save which failed left aside (clean_partial), so that --resume auto chooses it, not the step before (which
    would then move it to superseded/); the other ranks wait for it, then choose alike."""
    from accelerate import PartialState  # (torch: the run folder's checks without a run never import it)

    if main:
        clean_partial(run, say)
    PartialState().wait_for_everyone()


def check_launch(cfg: TrainConfig, world: int) -> None:
    """What a launch of `world` processes checks before it creates anything: the world splits into
    context-parallel groups and the batch into data-parallel replicas."""
    check_batch(cfg.global_batch, cfg.micro_batch, check_world(world, cfg.cp))


def check_run_folder(cfg: TrainConfig) -> None:
    """A launch's check, under its lock, that the run folder takes this run (rank 0 then says what it finds); a
    step a failed save left aside is put back first, as the job does (clear_saves), so a launch whose only
    checkpoint it is resumes it rather than finding none."""
    run = Path(cfg.out)
    check_run_dir(cfg, run, lambda _message: None, lambda: clean_partial(run, say_on_stderr))


def open_run_dir(cfg: TrainConfig, run: Path, resumed: tuple[Path, int] | None, say: Callable[[str], None],
                 data_changes: list[str] | None = None) -> None:
    """Rank 0, holding the run folder's lock (lcft.folder_lock.folder_lock, taken before the run's checkpoints were
    read, and what interrupted saves left cleared then: `clear_saves`), starts the run there: on a resume of
    `resumed` (checkpoint, step) the checkpoints after its step moved to superseded/ (the resumed run owns those
    steps) and the options changed from those the checkpoint was trained with (with `data_changes`, from
    record_data) reported where a step is left to train; a new run says when it replaces an earlier one's config;
    then the resolved config, and the last invocation's summary.json removed."""
    # a resume changes what its checkpoint was trained with: the run's config.toml may be a later invocation's
    # that saved no checkpoint, or another folder's run (the run's where a checkpoint kept no config.toml)
    saved = resumed[0] if resumed is not None and (resumed[0] / RUN_CONFIG).is_file() else run
    changed = changed_options(cfg, saved)
    if resumed is None:
        if changed:  # check_run_dir let it through: no checkpoint there, so nothing of that run to continue
            say(f"{run} holds no checkpoint (nothing to resume): this new run with other options "
                f"({'; '.join(changed[:4])}) replaces its config.toml and metrics.jsonl")
    else:
        for name, moved in supersede_after(run, resumed[1]):
            say(f"{name} is after the resumed step {resumed[1]}: moved to {moved}")
        changed = [c for c in changed if c.split(":")[0] not in IGNORED_ON_RESUME] + list(data_changes or [])
        # at --steps already (the run's latest checkpoint, check_steps_ahead): no step follows for them to apply to
        if changed and resumed[1] < cfg.steps:
            say(f"resuming with changed options: {'; '.join(changed)} (they apply from the next step; "
                "the schedule continues from its position)")
    with write_faults(run / RUN_CONFIG):
        save_resolved(run / RUN_CONFIG, to_dict(cfg))
    (run / SUMMARY).unlink(missing_ok=True)  # the last invocation's: this one writes its own as it ends, a kill none
