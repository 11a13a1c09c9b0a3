"""`lcft train`: one flag per TrainConfig field (same names as the --config TOML keys), then lcft.launch.run."""

from __future__ import annotations

import typer

from lcft.cli.common import console
from lcft.cli.generate import Opt, command_from_config
from lcft.console import styled
from lcft.signals import Ended
from lcft.train.config import SECTIONS, TrainConfig


def ended(summary: dict) -> str:
    """How an invocation ended (summary.json's "stopped", an `Ended`), in the words of what ended it: the option
    the user gave, or the signal's name."""
    match Ended(summary["stopped"]):
        case Ended.DONE:
            return "done"
        case Ended.STOP_AFTER:
            return "stopped by --stop-after"
        case Ended.SIGNAL:
            return f"stopped by {summary['signal']}"
    raise AssertionError(f"no words for how a run ended: {summary['stopped']}")


def _run(cfg: TrainConfig) -> None:
    from lcft.launch import run  # torch/accelerate load only when a run starts
    from lcft.signals import exit_code

    s = run("train", cfg)  # in this process, or --nproc N launched ones
    if "node_rank" in s:  # a node without rank 0 (several nodes): its ranks ended with rank 0's, which saved
        console.print(f"node {s['node_rank']}: {ended(s)} at step {s['step']}/{s['steps']}; rank 0 wrote the "
                      "checkpoint and the summary", highlight=False, soft_wrap=True)
    else:
        bits = f" ({s['bits_per_base']:.3f} bits/base)" if s.get("bits_per_base") is not None else ""
        loss = f"loss {s['loss']:.4f} nats/token{bits}" if s.get("loss") is not None else ""
        console.print(styled((ended(s), "bold"), f" at step {s['step']}/{s['steps']} {loss}; "
                             f"checkpoint {s['checkpoint']}"), highlight=False, soft_wrap=True)
    if code := exit_code(s):  # stopped by a signal after its checkpoint: not a finished run (128 + signal)
        raise typer.Exit(code)


def _options() -> dict[str, Opt]:
    """Each option in its section's help panel; the folder options show PATH."""
    paths = ("data", "out", "init", "resume")
    return {n: Opt(metavar="PATH" if n in paths else None, panel=panel) for panel, names in SECTIONS.items()
            for n in names}


def register(app: typer.Typer) -> None:
    command_from_config(
        app, "train", TrainConfig, _run, options=_options(),
        help="Train (or continue training) the decoder on prepared windows: Accelerate, checkpoints, "
             "resume, metrics.jsonl. --nproc N starts N local processes (torchrun, gloo on CPU). Exit codes: 0 "
             "finished (also when a signal came during the last step), 1 user error, 128+N stopped by signal N "
             "after a checkpoint (143 SIGTERM), 75 a rank or node stopped answering.")
