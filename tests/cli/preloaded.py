"""`python -m MODULE ...` and `python -c SCRIPT ...` as processes forked from one that imported torch and lcft once
(the `preloaded` fixture): each is a process of its own (SIGKILL, a file-size limit, its exit status and output as a
subprocess has them), without the seconds of start-up a fresh interpreter spends importing torch."""

from __future__ import annotations

import atexit
import builtins
import importlib
import io
import multiprocessing
import os
import resource
import runpy
import selectors
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import NoReturn

import pytest

from tests.unprivileged import drop_mode_overrides

# What `lcft train`, `lcft export` and the tests' scripts import. Not lcft.__main__: `-m lcft` runs it afresh. Not
# huggingface_hub (nor transformers, which imports it): it reads HF_HOME, HF_ENDPOINT, HF_HUB_OFFLINE... once, at its
# import, so a child imports it under the child's own environment, as a fresh interpreter does.
PRELOAD = ("torch", "lcft.cli.app", "lcft.train", "lcft.train.trainer", "lcft.checkpoint.export", "lcft.checkpoint.dcp",
           "lcft.checkpoint.hf_folder", "safetensors.torch")


def _serve(conn: Connection, preload: tuple[str, ...]) -> None:
    """The preloaded process: its imports once, then one forked child per request until it gets None. One OpenMP
    thread: importing torch then starts no thread, so a fork copies no lock another thread held."""
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in preload:
        importlib.import_module(name)
    while (request := conn.recv()) is not None:
        conn.send(_fork(conn, *request))


def _fork(conn: Connection, argv: list[str], env: dict[str, str], limits: dict[int, int], cwd: str | None,
          unprivileged: bool) -> tuple[int, bytes, bytes]:
    """Run `python ARGV` in a forked child; sends its pid first, returns its exit status and output."""
    pipes = [os.pipe(), os.pipe()]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(conn, argv, env, limits, cwd, unprivileged, pipes)
    for _, w in pipes:
        os.close(w)
    conn.send(pid)
    out = _drain([r for r, _ in pipes])
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out[0], out[1]


def _drain(fds: list[int]) -> list[bytes]:
    """Everything written to the pipes `fds` until each is closed."""
    got = {fd: bytearray() for fd in fds}
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                if chunk := os.read(key.fd, 65536):
                    got[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
    return [bytes(got[fd]) for fd in fds]


def _child(conn: Connection, argv: list[str], env: dict[str, str], limits: dict[int, int], cwd: str | None,
           unprivileged: bool, pipes: list[tuple[int, int]]) -> NoReturn:
    """The forked child: stdin from /dev/null, stdout and stderr into the pipes (not files: a file-size limit
    spares pipes), the request's environment, working folder, limits (soft; RLIMIT_* -> bytes) and capabilities,
    then `python ARGV` to its end."""
    code = 1
    try:
        conn.close()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, (r, w) in zip((1, 2), pipes, strict=True):
            os.dup2(w, fd)
            os.close(r)
            os.close(w)
        sys.stdin, sys.stdout = _stdio(0, sys.__stdout__), _stdio(1, sys.__stdout__)
        sys.stderr = _stdio(2, sys.__stderr__)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        for which, value in limits.items():  # (Python ignores SIGXFSZ: a write past RLIMIT_FSIZE fails with EFBIG)
            resource.setrlimit(which, (value, resource.getrlimit(which)[1]))
        if unprivileged and os.geteuid() == 0:
            drop_mode_overrides()
        code = _python(argv)
    finally:
        os._exit(code)




def _stdio(fd: int, like: io.TextIOWrapper) -> io.TextIOWrapper:
    """Standard stream `fd` made anew on what it now is, as Python's start-up makes one on a pipe: the old one was
    made on what this process started with (pytest's capture file, seekable, which stream.reconfigure then tries),
    and its encoding, errors and line buffering (stderr only: no terminal) are those of `like`."""
    raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
    buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors,
                            line_buffering=fd != 0 and like.line_buffering)


def _python(argv: list[str]) -> int:
    """What the interpreter does with `python ARGV` (-m or -c) after its start-up: run it, print an uncaught
    exception's traceback (exit 1; KeyboardInterrupt: killed by SIGINT) or take SystemExit's code, wait for the
    threads left, run atexit, flush."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        else:
            raise ValueError(f"python {argv[0]}: only -m and -c are run here")
        code = 0
    except SystemExit as e:
        code = _exit_status(e.code)
    except BaseException as e:
        # printed from the script's own frames on, as by the interpreter (not from this function's)
        e = e.with_traceback(e.__traceback__.tb_next if e.__traceback__ else None)
        sys.excepthook(type(e), e, e.__traceback__)
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt: Python ends killed by SIGINT, as its shell expects
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Preloaded:
    """The preloaded process (spawned once), and `run` for each command forked from it; `preload`: the modules it
    imports (a test of what a command imports names fewer)."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.server = ctx.Process(target=_serve, args=(theirs, preload), daemon=True, name="lcft-preloaded")
        self.server.start()
        theirs.close()

    def run(self, argv: list[str], env: dict[str, str] | None = None, limit: int | None = None,
            timeout: float = 300, unprivileged: bool = False, address_space: int | None = None,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
        """`python ARGV` forked off, as subprocess.run(..., capture_output=True, text=True) returns it; `env`:
        its whole environment (default this one's); `limit`: its RLIMIT_FSIZE in bytes; `unprivileged`: folder modes
        apply to it, root's included (as tests.unprivileged.unprivileged runs a command); `address_space`: its
        RLIMIT_AS in bytes (what it maps counts the preloaded imports' too); `cwd`: its working folder. SIGKILLed
        past timeout."""
        limits = {which: value for which, value in ((resource.RLIMIT_FSIZE, limit), (resource.RLIMIT_AS, address_space))
                  if value is not None}
        self.conn.send((argv, dict(os.environ if env is None else env), limits, None if cwd is None else str(cwd),
                        unprivileged))
        if not self.conn.poll(120):  # (the first request waits for the imports)
            raise AssertionError(f"the preloaded process did not start `python {argv[0]} {argv[1]}`")
        pid = self.conn.recv()
        if not self.conn.poll(timeout):
            os.kill(pid, signal.SIGKILL)
            self.conn.recv()
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
        rc, out, err = self.conn.recv()
        return subprocess.CompletedProcess([sys.executable, *argv], rc, out.decode(), err.decode())

    def close(self) -> None:
        self.conn.send(None)
        self.server.join(60)
        self.conn.close()


@pytest.fixture(scope="module")
def preloaded() -> Iterator[Preloaded]:
    """One preloaded process for the module's commands, ended (and reaped: its children's CPU counted) after it."""
    p = Preloaded()
    yield p
    p.close()
