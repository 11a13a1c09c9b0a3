"""`lcft eval`: held-out loss by position for one or more checkpoints (thin wrapper over lcft.evaluate)."""

from __future__ import annotations

from pathlib import Path

import typer

from lcft.cli.common import console, user_errors
from lcft.config import build, doc, format_size, load_toml, merge
from lcft.evaluate.config import EvalConfig

_SIZES = {"length", "base_context"}  # shown as 32K, 1K
_EXAMPLE = ("lcft eval --data data/hg38-512k --checkpoint runs/base --checkpoint runs/long "
            "--label base --label long --out reports/long-vs-base")


def resolve_eval_config(config_file: str | None, flags: dict) -> EvalConfig:
    """defaults < --config TOML < flags (None = not given); unknown TOML keys are an error naming the key."""
    layers = [load_toml(config_file) if config_file else {}, flags]
    return build(EvalConfig, merge(*layers), where="eval config")


def option_help(cls: type, name: str) -> str:
    """A config field's docstring plus its default as the user would type it (parentheses, not brackets:
    typer's rich help would read [default: x] as markup)."""
    default = getattr(cls(), name)
    shown = format_size(default) if name in _SIZES and isinstance(default, int) else default
    return doc(cls, name) + (f" (default: {shown})" if shown not in ("", None, ()) else "")


def register(app: typer.Typer) -> None:
    h = lambda name: option_help(EvalConfig, name)

    @app.command("eval", epilog=f"Example: {_EXAMPLE}")
    @user_errors
    def _eval(
        data: str = typer.Option(None, "--data", metavar="DIR", help=doc(EvalConfig, "data")),
        checkpoint: list[str] = typer.Option(None, "--checkpoint", "-c", metavar="PATH", help=doc(EvalConfig, "checkpoints") + " Repeat the option."),
        label: list[str] = typer.Option(None, "--label", metavar="NAME", help=doc(EvalConfig, "labels") + " Repeat the option."),
        split: str = typer.Option(None, "--split", metavar="SPLIT", help=h("split")),
        bins: int = typer.Option(None, "--bins", metavar="N", help=h("bins")),
        bin_scale: str = typer.Option(None, "--bin-scale", metavar="linear|log", help=h("bin_scale")),
        max_context: list[str] = typer.Option(None, "--max-context", metavar="SIZE", help=doc(EvalConfig, "max_context") + " Sizes like 1K; repeat for one per checkpoint."),
        max_windows: int = typer.Option(None, "--max-windows", metavar="N", help=h("max_windows")),
        batch_size: int = typer.Option(None, "--batch-size", metavar="N", help=h("batch_size")),
        precision: str = typer.Option(None, "--precision", metavar="fp32|bf16", help=h("precision")),
        device: str = typer.Option(None, "--device", metavar="DEVICE", help=h("device")),
        out: str = typer.Option(None, "--out", "-o", metavar="DIR", help=h("out")),
        nproc: int = typer.Option(None, "--nproc", metavar="N", help=h("nproc")),
        cp: int = typer.Option(None, "--cp", metavar="N", help=h("cp")),
        cp_layout: str = typer.Option(None, "--cp-layout", metavar="zigzag|contiguous", help=h("cp_layout")),
        cp_kv: str = typer.Option(None, "--cp-kv", metavar="all|selected|stream", help=h("cp_kv")),
        config: str = typer.Option(None, "--config", metavar="TOML", help="TOML file with any of these options (flags override it)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or table (the files are still written)."),
    ) -> None:
        """Per-token held-out loss through each checkpoint, by position in the window: table, CSV, JSON, plot."""
        flags = {
            "data": data, "checkpoints": checkpoint or None, "labels": label or None, "split": split,
            "bins": bins, "bin_scale": bin_scale, "max_context": max_context or None, "max_windows": max_windows,
            "batch_size": batch_size, "precision": precision, "device": device, "out": out,
            "nproc": nproc, "cp": cp, "cp_layout": cp_layout, "cp_kv": cp_kv,
        }
        cfg = resolve_eval_config(config, flags)
        from lcft.evaluate.report import print_table
        from lcft.evaluate.runner import evaluate

        report = evaluate(cfg, progress=not quiet)
        if not quiet:
            print_table(report)
            outdir = Path(cfg.out)
            console.print(f"plot: {outdir / 'loss_by_position.png'}\nfigures: {outdir / 'eval.json'}, "
                          f"{outdir / 'loss_by_position.csv'}", highlight=False, soft_wrap=True)
