"""Shared CLI plumbing: one console, and a wrapper that turns user errors into a one-line message + exit 1."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from lcft.console import make_console, styled
from lcft.errors import RESUME, LcftError, printable
from lcft.signals import Terminated, terminate_as_interrupt

console = make_console()
err_console = make_console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` on stderr and return the Exit to raise."""
    err_console.print(styled(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def user_errors(fn: F, resumes: bool = False) -> F:
    """Decorate a command: LcftError (and missing files, names too long for the file system) become a one-line
    error and exit code 1 (or the error's own exit_code); a Ctrl-C is `interrupted`, exit 130, and for a command
    that `resumes` where it stopped (`functools.partial(user_errors, resumes=True)`), how to go on; such a command
    takes a SIGTERM as a Ctrl-C (lcft.signals.terminate_as_interrupt): `stopped by SIGTERM`, exit 143."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with terminate_as_interrupt() if resumes else contextlib.nullcontext():
                return fn(*args, **kwargs)
        except LcftError as e:  # a few carry their own exit code (a lost rank, a second signal)
            raise fail(str(e), e.exit_code) from None
        except FileNotFoundError as e:
            raise fail(f"file not found: {e.filename or e}") from None
        except OSError as e:  # a name the user chose, or one lcft makes from it (an index beside a FASTA, a temp
            if e.errno != errno.ENAMETOOLONG:  # sibling '.NAME.tmp'), over the file system's limit
                raise
            name = printable(os.fsdecode(e.filename or e.filename2 or ""))
            raise fail(f"{name}: name too long for the file system (most allow 255 bytes a name): choose a shorter "
                       "file or folder name") from None
        except KeyboardInterrupt as e:
            said = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
            err_console.print(f"{said}: {RESUME}" if resumes else said, style="yellow", soft_wrap=True)
            sys.exit(143 if isinstance(e, Terminated) else 130)

    return wrapper  # type: ignore[return-value]
