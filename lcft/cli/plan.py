"""`lcft plan`: one flag per PlanConfig field (every `lcft train` option plus --gpu-memory, --gpus-per-node)."""

from __future__ import annotations

import typer

from lcft.cli.common import console
from lcft.cli.generate import Opt, command_from_config
from lcft.plan.config import PlanConfig


def _run(cfg: PlanConfig) -> None:
    from lcft.plan.plan import report  # torch loads only when a plan is made

    text, fits = report(cfg)
    console.print(text, highlight=False, soft_wrap=True, markup=False)
    if not fits:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    command_from_config(
        app, "plan", PlanConfig, _run, options={n: Opt(metavar="PATH") for n in ("data", "out", "init", "resume")},
        help="Per-rank memory of a training layout (parameters, gradients, optimizer state, activations, K/V) "
             "and whether it fits the GPUs, with the options that would make it fit. Takes `lcft train`'s "
             "options; reads only the model's config.json (and, with --data, its tokenizer files: it must read the "
             "data's vocabulary, as train checks). Exit code 1 when it does not fit.")
