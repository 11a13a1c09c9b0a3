"""`lcft demo`: the published experiment in miniature on the bundled human sample (thin wrapper over run_demo)."""

from __future__ import annotations

import typer

from lcft.cli.common import console
from lcft.cli.generate import PROGRESS, Opt, command_from_config
from lcft.recipes.demo import DemoConfig

OPTIONS = {
    "out": Opt(aliases=("-o",), metavar="DIR"),
    "preset": Opt(metavar="NAME"),
    "num_hidden_layers": Opt(flag="--layers"),
    "num_attention_heads": Opt(flag="--heads"),
}


def _run(cfg: DemoConfig, progress: bool) -> None:
    from lcft.evaluate.terminal import print_table
    from lcft.recipes.demo import run_demo

    res = run_demo(cfg, progress=progress, log=lambda m: console.print(m, highlight=False, soft_wrap=True))
    console.print()
    print_table(res["report"])
    for line in res["summary"]:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    console.print(f"\n{res['note']}", style="bold", highlight=False)
    console.print(f"\nplot: {res['plot']}\nfigures: {res['report_dir']}/eval.json, "
                  f"{res['report_dir']}/loss_by_position.csv\ntotal {res['total_seconds']:.0f} s",
                  highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    command_from_config(
        app, "demo", DemoConfig, _run, options=OPTIONS,
        extras={"progress": PROGRESS},
        help="Prepare the bundled human sample, train a tiny base model at a short context, continue it at a long "
             "context with sparse attention, and compare held-out loss by position (with the short-context control).")
