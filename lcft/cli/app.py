"""The `lcft` typer app: registers each command group from its own module."""

from __future__ import annotations

import contextlib
import os
import sys

import typer

from lcft import __version__
from lcft.cli import demo, eval, export, plan, prepare, train
from lcft.cli.common import fail
from lcft.cli.help import Typer
from lcft.console import (
    PIPE_CLOSED,
    failed_stream,
    quiet_streams,
    standard_streams,
    stdout_identity,
    zero_columns,
)
from lcft.environment import check_environment
from lcft.errors import LcftError

app = Typer(
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
    standard_streams()
    zero_columns()
    try:
        check_environment(next((a for a in sys.argv[1:] if not a.startswith("-")), None))  # (the subcommand)
    except LcftError as e:
        raise SystemExit(fail(str(e)).exit_code) from None
    stdout, fd1 = sys.stdout, stdout_identity()
    try:
        app()
    except OSError as e:  # a standard stream that takes no more (a job's log file on a full disk or quota)
        if (stream := failed_stream(e)) is None:
            raise
        with contextlib.suppress(OSError):  # (stderr may be the stream that failed)
            os.write(2, f"error: cannot write to {stream} ({e.strerror or e}): free space where it goes, or send "
                        "it elsewhere\n".encode())
        quiet_streams()
        raise SystemExit(1) from None
    except SystemExit as e:
        # Output typer writes itself (help, usage, --version) ends quietly when its pipe closes, but with exit
        # code 1, which means a user error here: typer swaps a wrapper in for sys.stdout, rich (its help) points
        # stdout at /dev/null. lcft's own consoles exit as `cat` does (lcft.console.PlainConsole); so does this.
        if e.code == 1 and (sys.stdout is not stdout or stdout_identity() != fd1):
            raise SystemExit(PIPE_CLOSED) from None
        raise


if __name__ == "__main__":
    main()
