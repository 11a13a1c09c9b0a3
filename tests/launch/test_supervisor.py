"""The supervisor on a node whose /proc hides other users' processes (hidepid=1): it still finds the workers."""

from __future__ import annotations

import builtins
import errno
import os
import signal
import sys
import threading
import time

import psutil
import psutil._common

from lcft.launch.supervisor import Supervisor

AGENT = """
import subprocess, sys
sys.exit(subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]]).returncode)
"""
WORKER = """
import pathlib, signal, sys, time
def stop(signum, frame):
    pathlib.Path(sys.argv[1], "told").write_text(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1], "up").write_text("")
time.sleep(60)
sys.exit(3)
"""


def test_a_proc_that_refuses_another_users_process_still_passes_the_stop_signal_on(tmp_path, monkeypatch):
    """/proc mounted hidepid=1 (systemd's ProtectProc=noaccess): another user's /proc/PID/stat is EPERM, as here
    init's. The workers are still found and told the stop signal, which they save on (psutil's children()
    read every process's parent and raised AccessDenied on the first poll: the launch ended with a traceback,
    torchrun left running in its own session, no signal passed on)."""
    def hidden(name: object, *args: object, **kwargs: object) -> object:
        if os.fsdecode(name) == f"{psutil.PROCFS_PATH}/1/stat":
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), name)
        return builtins.open(name, *args, **kwargs)

    monkeypatch.setattr(psutil._common, "open", hidden, raising=False)
    supervisor = Supervisor([sys.executable, "-c", AGENT, WORKER, str(tmp_path)], dict(os.environ),
                            failure=tmp_path / "failure.txt", errors=None, nproc=1, elastic=False, resume="")

    def stop_once_up() -> None:
        deadline = time.monotonic() + 60
        while not (tmp_path / "up").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's stop reaches the launcher

    threading.Thread(target=stop_once_up, daemon=True).start()
    try:
        assert supervisor.run() == 0
    finally:
        monkeypatch.undo()
        if hasattr(supervisor, "proc") and supervisor.proc.poll() is None:  # left running by a failed supervisor
            for p in [*psutil.Process(supervisor.proc.pid).children(recursive=True), supervisor.proc]:
                p.kill()
            supervisor.proc.wait()
    assert (tmp_path / "told").read_text() == str(int(signal.SIGTERM))
