"""A train into a run folder another process writes is refused by that lock before the run's checkpoints are read
(they change while the other run saves and prunes), with or without --resume."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lcft.checkpoint.layout import checkpoints_dir
from lcft.train import TrainConfig, train
from tests.one_line import one_line

HOLD = "import sys; from lcft.folder_lock import folder_lock\nwith folder_lock(sys.argv[1], 'lcft train'):\n" \
       "    print('held', flush=True); sys.stdin.read()"


@pytest.fixture
def held_run(tmp_path, base_cfg) -> Iterator[Path]:
    """A run with checkpoints whose folder another process holds (its lock, as a running `lcft train`)."""
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 2, "save_every": 1}))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield run
    finally:
        holder.communicate("", timeout=60)


def test_a_new_run_into_a_held_folder_names_the_holder(held_run, base_cfg):
    one_line(lambda: train(TrainConfig(out=str(held_run), **base_cfg)), "another `lcft train` is writing into",
             str(held_run))


def test_a_resume_of_a_held_run_is_refused_before_its_checkpoints_are_read(held_run, base_cfg):
    for ckpt in checkpoints_dir(held_run).iterdir():  # what a reader racing the holder can find: none left
        shutil.rmtree(ckpt)
    one_line(lambda: train(TrainConfig(out=str(held_run), resume="auto", **base_cfg)),
             "another `lcft train` is writing into", str(held_run))
