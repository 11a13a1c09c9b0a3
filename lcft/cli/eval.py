"""`lcft eval`: held-out loss by position for one or more checkpoints (thin wrapper over lcft.evaluate)."""

from __future__ import annotations

from pathlib import Path

import typer

from lcft.cli.common import console, err_console
from lcft.cli.generate import PROGRESS, Extra, Opt, command_from_config
from lcft.evaluate.config import EvalConfig

_EXAMPLE = ("lcft eval --data data/hg38-512k --checkpoint runs/base --checkpoint runs/long "
            "--label base --label long --out reports/long-vs-base")
OPTIONS = {
    "data": Opt(metavar="DIR"),
    "checkpoints": Opt(flag="--checkpoint", aliases=("-c",), metavar="PATH"),
    "labels": Opt(flag="--label", metavar="NAME"),
    "split": Opt(metavar="SPLIT"),
    "max_context": Opt(note="Sizes like 1K; repeat for one per checkpoint."),
    "device": Opt(metavar="DEVICE"),
    "out": Opt(aliases=("-o",), metavar="DIR"),
}


def _run(cfg: EvalConfig, progress: bool, quiet: bool) -> None:
    from lcft.evaluate.report import CSV_NAME, JSON_NAME, PNG_NAME
    from lcft.evaluate.terminal import print_table
    from lcft.launch import run
    from lcft.signals import exit_code

    for warning in (*cfg.idle_split(), *cfg.idle_probe()):  # options that change nothing; stdout holds the report
        err_console.print(warning, highlight=False, soft_wrap=True)
    report = run("eval", cfg, progress=progress and not quiet)  # in this process, or --nproc N launched ones
    code = exit_code(report)  # stopped by a signal, its losses kept: not a finished evaluation
    if "node_rank" in report:  # a node without rank 0 (several nodes): rank 0 wrote the report, or kept the losses
        done = f"stopped by {report.get('signal')}; rank 0 kept the losses" if code else "done; rank 0 wrote the report"
        console.print(f"node {report['node_rank']}: {done}", highlight=False)
    elif code:
        console.print(report["note"], highlight=False, soft_wrap=True)
    elif quiet:
        pass
    elif report.get("already"):
        console.print(f"already evaluated: {cfg.out}; the same checkpoints (by content), data and options: "
                      f"nothing computed (the report: {Path(cfg.out) / JSON_NAME})", highlight=False, soft_wrap=True)
    else:
        print_table(report)
        outdir = Path(cfg.out)
        console.print(f"plot: {outdir / PNG_NAME}\nfigures: {outdir / JSON_NAME}, {outdir / CSV_NAME}",
                      highlight=False, soft_wrap=True)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    command_from_config(
        app, "eval", EvalConfig, _run, options=OPTIONS, epilog=f"Example: {_EXAMPLE}",
        extras={"progress": PROGRESS,
                "quiet": Extra(("--quiet", "-q"), "Nothing on stdout, no table or file list, and no progress bar "
                                                  "(the files are still written).")},
        help="Per-token held-out loss through each checkpoint, by position in the window: table, CSV, JSON, plot. "
             "Resumes when run again after a stop. Exit codes: 0 finished, 1 user error, 128+N stopped by signal N "
             "after its batch (143 SIGTERM; the losses kept), 75 a rank or node stopped answering.")
