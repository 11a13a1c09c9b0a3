"""The temporary folders of killed launchers: a launch removes those its launcher left (SIGKILLed), and keeps those
of running launchers, of other users, and anything not laid out as a launch's folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lcft.launch.temp_folder import MARK, launch_folder

# A launcher as far as its temporary folder goes: it makes one with the launch's own code, says where, and waits.
HOLDER = """
import sys, time
from lcft.launch.temp_folder import launch_folder
with launch_folder() as tmp:
    (tmp / "handed").mkdir()
    (tmp / "spec.toml").write_text("steps = 1\\n")
    print(tmp, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _hold(holders: list[subprocess.Popen]) -> tuple[subprocess.Popen, Path]:
    """A launcher stand-in (HOLDER) running, in this test's TMPDIR, and its folder."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, TMPDIR=tempfile.gettempdir()))
    holders.append(p)
    return p, Path(p.stdout.readline().strip())


def _next_launch() -> None:
    """What a launch does with its temporary folder, start to end (lcft.launch.launch)."""
    with launch_folder() as tmp:
        assert tmp.is_dir() and (tmp / MARK).is_file()
    assert not tmp.exists()


def test_a_killed_launchers_folder_goes_at_the_next_launch_and_a_running_ones_stays(holders):
    killed, left = _hold(holders)
    _, running = _hold(holders)
    killed.kill()
    killed.wait()
    assert sorted(os.listdir(left)) == sorted([MARK, "handed", "spec.toml"])  # SIGKILL gave it no time to clean up
    _next_launch()
    assert not left.exists()
    assert sorted(os.listdir(running)) == sorted([MARK, "handed", "spec.toml"])
    assert sorted(os.listdir(tempfile.gettempdir())) == [running.name]


def _left_folder(name: str = "lcft-launch-abcd_123") -> Path:
    """A folder as a killed launcher leaves it: named, marked and laid out as a launch's, no lock held."""
    folder = Path(tempfile.gettempdir()) / name
    (folder / "logs" / "attempt_0").mkdir(parents=True)
    for file in ("spare", "spec.toml", "result.json", ".failures.json.tmp"):
        (folder / file).write_text("")
    (folder / MARK).write_bytes(Path("/proc/sys/kernel/random/boot_id").read_bytes())  # this kernel's
    return folder


@pytest.mark.parametrize("change", ["unmarked", "marked by a link", "marked by another machine", "an empty mark",
                                    "another file in it", "a short name", "another name", "a link to it",
                                    "another user's"])
def test_what_is_not_a_killed_launchers_folder_stays(change):
    folder = _left_folder()
    if change == "unmarked":  # (also an older lcft's, which may still run: its launcher held no lock)
        (folder / MARK).unlink()
    elif change == "marked by a link":
        (folder / MARK).unlink()
        (folder / MARK).symlink_to(folder / "spec.toml")
    elif change == "marked by another machine":  # a TMPDIR shared across machines: its lock is not this kernel's
        (folder / MARK).write_text("0c7f44a3-3c5e-4b1f-9f0e-6f1d2a3b4c5d\n")
    elif change == "an empty mark":  # (an older lcft's mark)
        (folder / MARK).write_bytes(b"")
    elif change == "another file in it":
        (folder / "notes.txt").write_text("mine")
    elif change in ("a short name", "another name"):
        folder = folder.rename(folder.with_name("lcft-launch-abc" if change == "a short name" else "lcft-run-abcd_123"))
    elif change == "a link to it":
        folder = folder.rename(folder.with_name("kept"))
        Path(tempfile.gettempdir(), "lcft-launch-linked12").symlink_to(folder)
    elif os.getuid() != 0:
        pytest.skip("only root can give a folder to another user")
    else:
        os.chown(folder, 12345, 12345)
    before = sorted(os.listdir(tempfile.gettempdir()))
    _next_launch()
    assert sorted(os.listdir(tempfile.gettempdir())) == before


def test_the_left_folder_of_the_test_above_is_taken_for_one():
    """The oracle of the test above: without a change, the folder goes."""
    _left_folder()
    _next_launch()
    assert os.listdir(tempfile.gettempdir()) == []

