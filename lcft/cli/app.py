"""The `lcft` typer app: registers each command group from its own module."""

from __future__ import annotations

import typer

from lcft import __version__
from lcft.cli import demo, eval, export, plan, prepare, train

app = typer.Typer(
    name="lcft",
    help="Long-context fine-tuning of language models on genomes: prepare windows, train, evaluate by position.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lcft {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """lcft: long-context fine-tuning on genomes."""


for _mod in (prepare, train, plan, eval, export, demo):
    _mod.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
