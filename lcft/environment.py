"""The process environment a cluster node hands the CLI, checked once as it starts, before torch loads: the
current folder, OMP_NUM_THREADS and torch's compiler cache folder."""

from __future__ import annotations

import os

from lcft.cpus import omp_threads
from lcft.errors import LcftError, printable, reason

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
# The commands that load torch's compiler (an optimizer's or a model's first use imports it, compiling or not);
# plan and prepare never do, so a compiler cache folder they would not use does not stop them.
COMPILER_COMMANDS = ("train", "eval", "export", "demo")


def check_environment(command: str | None) -> None:
    """LcftError for what would fail later with a traceback or a crash in `command` (the CLI's subcommand; None:
    none given); an empty OMP_NUM_THREADS (a job script's `export OMP_NUM_THREADS=$X` of an unset X) is dropped,
    as unset: libgomp would warn and ignore it."""
    working_folder()
    if omp_threads() is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    if command in COMPILER_COMMANDS:
        inductor_cache()


def working_folder() -> None:
    """The current folder must exist: in one deleted under the shell, loading torch kills the process (its MKL
    cannot load libtorch_cpu: 'Intel oneMKL FATAL ERROR', exit 2), and no relative path can be resolved."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise LcftError("the current folder was deleted (it no longer exists): cd into an existing folder and run "
                        "the command again") from None


def inductor_cache() -> None:
    """A TORCHINDUCTOR_CACHE_DIR the user set must be a folder this process can make and write: torch makes it as
    it loads its compiler, which every train, eval and export does (the optimizer imports it), compiling or not;
    one it cannot make is a PermissionError traceback there."""
    given = os.environ.get(INDUCTOR_CACHE_ENV)
    if not given:
        return
    try:
        os.makedirs(given, exist_ok=True)  # as torch does (torch._inductor.runtime.cache_dir_utils)
        writable = os.access(given, os.W_OK | os.X_OK)
    except OSError as e:
        why = reason(e.strerror or e)
    else:
        why = None if writable else "not writable"
    if why is not None:
        raise LcftError(f"{INDUCTOR_CACHE_ENV}={printable(given)} in the environment: cannot use it as torch's "
                        f"compiler cache ({why}): point it at a writable folder, or unset it")
