"""What tests run in each process of a gloo group they spawn (tests.parallel.harness.run_ranks), apart from their
modules: each spawned process imports the module of its function, and a test module's imports cost it a second."""

from __future__ import annotations

from lcft.errors import LcftError
from lcft.launch import run
from lcft.train import TrainConfig


def train_cp3(rank: int, world: int, data: str, out: str) -> tuple[str, str] | None:
    """lcft.launch.run of a --cp 3 run here: the user error it raises (its class name and text), or None."""
    try:
        run("train", TrainConfig(data=data, out=out, cp=3))
    except LcftError as e:
        return type(e).__name__, str(e)
    return None
