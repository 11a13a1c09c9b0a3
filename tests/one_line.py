"""Checks shared across test packages: an error a user can fix is one line naming what it should (and the line of
a refused folder rename, as lcft.disk.rename_refused writes it, with a stand-in for the file system that refuses)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.errors import LcftError


def one_line(call: Callable[[], Any], *needles: str, error: type[Exception] = LcftError) -> str:
    """`call()` raises `error` with a one-line message holding every needle; the message."""
    with pytest.raises(error) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    return msg


def cli_fails(args: list[str], *needles: str) -> str:
    """`lcft ARGS` exits 1 with one `error: ...` line (an uncaught exception would leave no such line)."""
    res = CliRunner().invoke(app, args)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), (res.output, res.exception)
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def refused(where: object, err: int) -> str:
    """The one line of a folder rename in `where` that its file system refuses with `err`."""
    return (f"cannot rename folders on the file system of {where} ({os.strerror(err)} (errno {err})): gcsfuse "
            "renames a folder only under its --rename-dir-limit (0 by default: raise it, or use a bucket with "
            "hierarchical namespace); else use an output folder on another file system")


def gcsfuse(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """os.`call` (rename or replace) as gcsfuse on a flat bucket does it: a folder holding files is refused with
    EMFILE past --rename-dir-limit (0 by default; gcsfuse's internal/fs/fs.go), an empty folder or a file renames."""
    real = getattr(os, call)

    def renamed(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if os.path.isdir(src) and os.listdir(src):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        real(src, dst)

    monkeypatch.setattr(os, call, renamed)
