"""`lcft demo`: the published experiment in miniature on the bundled human sample (thin wrapper over run_demo)."""

from __future__ import annotations

import typer

from lcft.cli.common import console, user_errors
from lcft.cli.eval import option_help
from lcft.config import build, load_toml, merge
from lcft.recipes.demo import DemoConfig


def register(app: typer.Typer) -> None:
    h = lambda name: option_help(DemoConfig, name)

    @app.command("demo")
    @user_errors
    def _demo(
        out: str = typer.Option(None, "--out", "-o", metavar="DIR", help=h("out")),
        length: str = typer.Option(None, "--length", metavar="SIZE", help=h("length")),
        base_context: str = typer.Option(None, "--base-context", metavar="SIZE", help=h("base_context")),
        steps: int = typer.Option(None, "--steps", metavar="N", help=h("steps")),
        long_steps: int = typer.Option(None, "--long-steps", metavar="N", help=h("long_steps")),
        base_batch: int = typer.Option(None, "--base-batch", metavar="N", help=h("base_batch")),
        long_batch: int = typer.Option(None, "--long-batch", metavar="N", help=h("long_batch")),
        lr: float = typer.Option(None, "--lr", metavar="FLOAT", help=h("lr")),
        long_lr: float = typer.Option(None, "--long-lr", metavar="FLOAT", help=h("long_lr")),
        preset: str = typer.Option(None, "--preset", metavar="NAME", help=h("preset")),
        hidden_size: int = typer.Option(None, "--hidden-size", metavar="N", help=h("hidden_size")),
        num_hidden_layers: int = typer.Option(None, "--layers", metavar="N", help=h("num_hidden_layers")),
        num_attention_heads: int = typer.Option(None, "--heads", metavar="N", help=h("num_attention_heads")),
        intermediate_size: int = typer.Option(None, "--intermediate-size", metavar="N", help=h("intermediate_size")),
        eval_windows: int = typer.Option(None, "--eval-windows", metavar="N", help=h("eval_windows")),
        eval_batch: int = typer.Option(None, "--eval-batch", metavar="N", help=h("eval_batch")),
        bins: int = typer.Option(None, "--bins", metavar="N", help=h("bins")),
        seed: int = typer.Option(None, "--seed", metavar="N", help=h("seed")),
        config: str = typer.Option(None, "--config", metavar="TOML", help="TOML file with any of these options (flags override it)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    ) -> None:
        """Prepare the bundled human sample, train a tiny base model at a short context, continue it at a long
        context with sparse attention, and compare held-out loss by position (with the short-context control)."""
        flags = {
            "out": out, "length": length, "base_context": base_context, "steps": steps, "long_steps": long_steps,
            "base_batch": base_batch, "long_batch": long_batch, "lr": lr, "long_lr": long_lr, "preset": preset,
            "hidden_size": hidden_size, "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads, "intermediate_size": intermediate_size,
            "eval_windows": eval_windows, "eval_batch": eval_batch, "bins": bins, "seed": seed,
        }
        cfg = build(DemoConfig, merge(load_toml(config) if config else {}, flags), where="demo config")
        from lcft.recipes.demo import run_demo
        from lcft.evaluate.report import print_table

        res = run_demo(cfg, progress=not quiet, log=lambda m: console.print(m, highlight=False, soft_wrap=True))
        console.print()
        print_table(res["report"])
        for line in res["summary"]:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        console.print(f"\n[bold]{res['note']}[/]", highlight=False)
        console.print(f"\nplot: {res['plot']}\nfigures: {res['report_dir']}/eval.json, "
                      f"{res['report_dir']}/loss_by_position.csv\ntotal {res['total_seconds']:.0f} s",
                      highlight=False, soft_wrap=True)
