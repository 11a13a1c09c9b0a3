"""`lcft train`: one flag per TrainConfig field (same names as the --config TOML keys), then lcft.train.train."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import typer

from lcft.cli.common import console, user_errors
from lcft.config import doc, format_size
from lcft.train.config import TrainConfig, resolve_config

# Fields whose values are sizes: the help shows the default the way a user would type it.
_SIZES = {"seq_len"}
_PATHS = {"data", "out", "init", "resume"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _metavar(name: str, tp: Any) -> str:
    for arg in (tp, *typing.get_args(tp)):
        if typing.get_origin(arg) is typing.Literal:
            return "|".join(typing.get_args(arg))
    if name in _SIZES:
        return "SIZE"
    if name in _PATHS:
        return "PATH"
    kinds = {int, float} & {tp, *typing.get_args(tp)}
    return "N" if kinds == {int} else "FLOAT" if kinds else "TEXT"


def _parameters() -> list[inspect.Parameter]:
    """A keyword parameter per TrainConfig field: every flag defaults to None (= not given, so the TOML value
    or the dataclass default applies); build() coerces the strings ('512K', '1e-4', 'true')."""
    hints = typing.get_type_hints(TrainConfig)
    params = [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                default=typer.Option(None, "--config", metavar="TOML", help="TOML file with any of these options "
                                                     "(same names, underscores); flags override it."))]
    for f in dataclasses.fields(TrainConfig):
        tp = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = format_size(default) if f.name in _SIZES and isinstance(default, int) else default
        help_text = doc(TrainConfig, f.name) + (f" [default: {shown}]" if shown not in (None, "") else "")
        if tp is bool:
            opt = typer.Option(None, f"{_flag(f.name)}/--no-{f.name.replace('_', '-')}", help=help_text,
                               show_default=False)
            ann: Any = bool | None
        else:
            opt = typer.Option(None, _flag(f.name), help=help_text, show_default=False, metavar=_metavar(f.name, tp))
            ann = str | None
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def register(app: typer.Typer) -> None:
    params = _parameters()

    @user_errors
    def _cmd(**kwargs: Any) -> None:
        config = kwargs.pop("config", None)
        cfg = resolve_config(config, kwargs)
        from lcft.train import train  # torch/accelerate load only when a run starts

        s = train(cfg)
        loss = f"loss {s['loss']:.4f} ({s['bits_per_base']:.3f} bits/base)" if s.get("loss") is not None else ""
        console.print(f"[bold]{s['stopped']}[/] at step {s['step']}/{s['steps']} {loss}; "
                      f"checkpoint {s['checkpoint']}", highlight=False, soft_wrap=True)

    _cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    _cmd.__annotations__ = {p.name: p.annotation for p in params}
    _cmd.__doc__ = ("Train (or continue training) the decoder on prepared windows: Accelerate, checkpoints, "
                    "resume, metrics.jsonl. --nproc N starts N local processes (torchrun, gloo on CPU).")
    app.command("train")(_cmd)
