"""The jobs a launch can run (train, eval): how a worker reads its config, the work itself, and what is checked
before the work starts or a launch writes anything. An Entry's checks need no torch: the job's own modules (the
trainer, the evaluator) are imported only when its work runs, so a user error found by a check answers without
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lcft.errors import RESUME


@dataclass(frozen=True)
class Job:
    """One kind of launched work."""

    what: str
    """The work, for error messages ("training processes failed ...")."""
    command: str
    """The command that owns the output folder while the job runs (named when a second one is refused)."""
    entry: Callable[[], Entry]
    """Imports what the job is checked and started with (no torch); its work imports the job's modules."""
    resume: str
    """How a message that the job's processes ended early goes on: what is kept and how to resume."""


@dataclass(frozen=True)
class Entry:
    load: Callable[[str], Any]
    """A worker's config from the launch's spec file."""
    resolve: Callable[[Any], Any]
    """The config as given, checked and made absolute (both in this process and before a launch)."""
    check: Callable[[Any, int], None]
    """For a world of N processes (1 in this process), what needs neither torch nor a full read of an input: the
    world's split, the inputs found, the output folder where it needs no lock. Run before the job's modules are
    imported (the job makes these checks again itself)."""
    check_launch: Callable[[Any], Any]
    """What else a launch checks before it creates anything, reading inputs in full (eval: the split's files)."""
    check_out: Callable[[Any], None]
    """What the output folder must allow: run under the launch's lock, before a process starts."""
    done: Callable[[Any, Any], dict[str, Any] | None]
    """For a launch on one node, after check_launch (given what it returned): the summary of work already done
    (eval: a finished report of the same inputs in the output folder), which the launch returns without starting
    a process; else None."""
    work: Callable[..., dict[str, Any]]
    """The job in this process (one rank of a launch, or the only process); returns its summary. Imports the
    job's modules."""


def _train() -> Entry:
    from lcft.checkpoint.layout import check_output_folder, locate_local
    from lcft.folder_lock import held_elsewhere
    from lcft.genomics.shards import read_manifest
    from lcft.train.config import load_run_config, resolve_folders
    from lcft.train.run_dir import check_launch, check_run_dir, check_run_folder

    def check(cfg: Any, world: int) -> None:
        check_launch(cfg, world)
        read_manifest(cfg.data)  # --data is a prepared windows folder (the trainer checks its files against it)
        if cfg.resume or held_elsewhere(cfg.out):  # the checkpoint a resume names is verified (hashed) by the job;
            check_output_folder(cfg.out, "the run", ("run",), data=cfg.data)  # a run writing there: its lock says so
        else:  # another run's checkpoints in --out are refused (none is read)
            check_run_dir(cfg, Path(cfg.out), lambda _message: None)
        if cfg.init and not cfg.resume:  # (a resume trains the checkpoint's model: --init is not read)
            locate_local(cfg.init)  # found; read, verified and checked against the data by the job

    def work(cfg: Any, **kwargs: Any) -> dict[str, Any]:
        from lcft.train.trainer import train

        return train(cfg, **kwargs)

    return Entry(load_run_config, resolve_folders, check, lambda _cfg: None, check_run_folder, lambda *_: None, work)


def _eval() -> Entry:
    from lcft.config_build import build
    from lcft.config_toml import absolute_paths, load_toml
    from lcft.evaluate.config import EvalConfig
    from lcft.evaluate.inputs import check_inputs, open_split

    def work(cfg: Any, **kwargs: Any) -> dict[str, Any]:
        from lcft.evaluate.runner import evaluate

        return evaluate(cfg, **kwargs)

    def done(cfg: Any, split: Any) -> dict[str, Any] | None:
        from lcft.evaluate.report import JSON_NAME

        if not (Path(cfg.out) / JSON_NAME).is_file():  # (a first run: nothing hashed, torch not imported)
            return None
        from lcft.evaluate.runner import finished_before_launch

        return finished_before_launch(cfg, split)

    return Entry(lambda path: build(EvalConfig, load_toml(path)), absolute_paths, check_inputs, open_split,
                 lambda _cfg: None, done, work)


JOBS = {
    "train": Job(what="training", command="lcft train", entry=_train,
                 resume="the run ended without a new checkpoint: start it again with --resume auto"),
    "eval": Job(what="evaluation", command="lcft eval", entry=_eval,
                resume=f"the evaluation ended, the losses of its finished batches kept: {RESUME}"),
}


def job(name: str) -> Job:
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r} (one of {', '.join(JOBS)})")
    return JOBS[name]

