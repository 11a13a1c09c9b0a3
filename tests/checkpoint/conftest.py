"""Checkpoint test fixtures: the trainer's small windows and model (tests/train/conftest.py)."""

from tests.train.conftest import _one_thread, data_dir, init_dir  # noqa: F401  (fixtures, by name)
