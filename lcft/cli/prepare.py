"""`lcft prepare` (placeholder until its issue lands)."""

import typer

from lcft.cli.common import not_yet

app = typer.Typer(help="Prepare genome data: FASTA -> verified fixed-length token windows.", no_args_is_help=True)


@app.command("windows")
def _windows() -> None:
    """Not yet available."""
    raise not_yet("prepare windows")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="prepare")
