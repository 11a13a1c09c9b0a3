"""`lcft eval` (placeholder until its issue lands)."""

import typer

from lcft.cli.common import not_yet


def register(app: typer.Typer) -> None:
    @app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def _cmd() -> None:
        """Not yet available."""
        raise not_yet("eval")
