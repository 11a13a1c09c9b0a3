"""Ending with the parent (lcft.launch.process.die_with_parent): a process whose parent is already gone when it
starts ends at once, however fast the parent went; one whose parent lives runs on and tells its own children."""

from __future__ import annotations

import os
import subprocess
import sys

from lcft.launch.process import PARENT_ENV

PROBE = "from lcft.launch.process import die_with_parent; die_with_parent(); import os; print(os.environ[{!r}])"


def _start(parent: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(PARENT_ENV)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, PARENT_ENV: parent})


def test_a_process_whose_parent_is_gone_before_it_runs_ends_at_once():
    """The agent found its launcher's pid replaced by init's (the launcher killed while the agent's Python was
    starting) and, comparing with that, trained on as an orphan; the pid its parent gave it tells them apart."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that was a parent and is no more
    got = _start(str(gone.pid))
    assert got.returncode == 1 and got.stdout == "", got


def test_a_process_whose_parent_lives_runs_and_names_itself_to_its_children():
    got = _start(str(os.getpid()))
    assert got.returncode == 0, got
    assert got.stdout.strip().isdigit() and int(got.stdout) != os.getpid()  # its own pid, for its children
