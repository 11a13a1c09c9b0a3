"""Writing checkpoints: atomic folders (temp folder, then rename), trainer state, pruning, partial-save cleanup.

The folder layout (and finding a run's checkpoints) is lcft.runs'. `trainer_state/` holds `state.json` (step,
data position, spike-guard history...), `optimizer.pt`, `scheduler.pt` and `rng.pt`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcft.errors import LcftError
from lcft.files import read_json
from lcft.runs import STATE_DIR, TMP_PREFIX, checkpoints_dir, list_checkpoints, step_name


@dataclass
class TrainerState:
    """Where a run stands, beyond weights and optimizer: everything exact resume needs."""

    step: int = 0
    """Optimizer steps taken (applied or skipped)."""
    samples_seen: int = 0
    """Global sample index of the next step's first sample (the data position)."""
    updates: int = 0
    """Applied updates (the learning-rate schedule's position; skipped steps do not advance it)."""
    skipped: int = 0
    """Skipped updates so far (non-finite loss or spike)."""
    consecutive_skips: int = 0
    """Skipped updates in a row, ending at the current step."""
    guard_history: list[float] = field(default_factory=list)
    """Recent applied-update losses the spike guard compares with."""
    elapsed: float = 0.0
    """Seconds of training over all invocations of the run."""
    world_size: int = 1
    """Processes of the invocation that wrote the checkpoint (informational: resuming on another size works)."""
    last_loss: float | None = None
    """Loss (nats per counted token) of the last step."""


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a checkpoint folder holds (from its state)."""
    return read_state(path).step


def clean_partial(run_dir: str | os.PathLike) -> list[Path]:
    """Remove temp folders left by saves that were interrupted (crash, SIGKILL); returns what was removed."""
    root = checkpoints_dir(run_dir)
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def prune(run_dir: str | os.PathLike, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (0 = keep all)."""
    if keep_last <= 0:
        return
    for _, p in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(run_dir: str | os.PathLike, step: int, write_model: Callable[[Path], None],
                     write_rest: Callable[[Path], None],
                     between: Callable[[int, Path], None] | None = None) -> Path:
    """Write `<run>/checkpoints/.tmp-step-N/`, flush it to disk, then rename it to `step-N` (atomic on POSIX).
    A crash at any point leaves either no `step-N` or a complete one; earlier checkpoints are untouched.
    `between(step, tmp)` runs after the model is written and before the rest (TrainHooks.during_save)."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    if final.exists():
        return final  # this step is already saved (e.g. --save-every hit the last step)
    tmp = root / (TMP_PREFIX + step_name(step))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_model(tmp)
    if between is not None:
        between(step, tmp)
    write_rest(tmp)
    _fsync_tree(tmp)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states (CUDA too when present)."""
    out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_trainer_state(ckpt: Path, state: TrainerState, optimizer: dict, scheduler: dict) -> None:
    """trainer_state/: state.json (readable), optimizer.pt, scheduler.pt, rng.pt."""
    d = ckpt / STATE_DIR
    d.mkdir(exist_ok=True)
    (d / "state.json").write_text(json.dumps(asdict(state), indent=1) + "\n")
    torch.save(optimizer, d / "optimizer.pt")
    torch.save(scheduler, d / "scheduler.pt")
    torch.save(rng_state(), d / "rng.pt")


def read_state(ckpt: str | os.PathLike) -> TrainerState:
    """The TrainerState of a checkpoint folder."""
    p = Path(ckpt) / STATE_DIR / "state.json"
    if not p.is_file():
        raise LcftError(f"{ckpt}: not a trainer checkpoint ({STATE_DIR}/state.json missing)")
    try:
        return TrainerState(**read_json(p))
    except TypeError as e:  # a field this version does not know, or one missing
        raise LcftError(f"{p}: not a trainer state of this lcft version ({e})") from None


def read_trainer_state(ckpt: str | os.PathLike) -> tuple[TrainerState, dict, dict, dict]:
    """(state, optimizer state dict, scheduler state dict, rng states) of a checkpoint folder."""
    d = Path(ckpt) / STATE_DIR
    state = read_state(ckpt)
    try:
        optim = torch.load(d / "optimizer.pt", map_location="cpu", weights_only=True)
        sched = torch.load(d / "scheduler.pt", map_location="cpu", weights_only=True)
        rng = torch.load(d / "rng.pt", map_location="cpu", weights_only=False)  # numpy/python tuples
    except (OSError, RuntimeError) as e:
        raise LcftError(f"{ckpt}: trainer state unreadable ({e})") from None
    return state, optim, sched, rng
