"""A checkpoint's trainer state: `trainer_state/` holds `state.json` (step, data position, spike-guard
history...), `optimizer.pt`, `scheduler.pt` and `rng.pt`: plain tensors, numbers and strings only, read with
`torch.load(weights_only=True)` once lcft.torch_zip finds every record stored inside the file, so a crafted file is
refused, never run nor inflated (lcft.checkpoint.resume checks and restores what they hold)."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcft.checkpoint.layout import STATE_DIR, STATE_FILE, STEP_DIR, previous_checkpoint
from lcft.checkpoint.model_files import is_sharded_checkpoint
from lcft.errors import LcftError, shown
from lcft.files import is_plain_name, read_json
from lcft.genomics.shards import is_count
from lcft.shapes import MAX_BATCH
from lcft.torch_zip import stored_records

SHA256 = re.compile(r"[0-9a-f]{64}")  # a hexdigest() as the data's manifest records it
# the most a loss in the spike guard's history can be: the objective is summed in float32 (cross-entropy, z-loss and
# router loss, none negative); the guard squares each loss's distance from their mean, which past this overflows
MAX_GUARD_LOSS = float(torch.finfo(torch.float32).max)
MT_WORDS = 624  # words of a Mersenne Twister state (python's state adds its position to them)


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
    data: dict[str, Any] | None = None
    """The training data's identity: window length, stride and the sha256 of each train-split file, as the data's
    manifest records them (lcft.train.run_dir.data_identity); None in checkpoints of an lcft that did not record
    it."""


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a checkpoint folder holds (from its state)."""
    return read_state(path).step


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states (CUDA too when present) as tensors, ints, floats and strings only."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out = {"python": [version, torch.tensor(mt, dtype=torch.int64), gauss],  # (625,) Mersenne Twister words
           "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
           "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned (checked by `_rng_fits` when read from a file)."""
    random.setstate(_python_state(state["python"]))
    np.random.set_state(_numpy_state(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_state(saved: list) -> tuple:
    version, mt, gauss = saved
    return int(version), tuple(int(x) for x in mt.tolist()), gauss


def _numpy_state(saved: list) -> tuple:
    name, keys, pos, has_gauss, cached = saved
    return str(name), keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)


def write_trainer_state(ckpt: Path, state: TrainerState, optimizer: dict | None, scheduler: dict) -> None:
    """trainer_state/: state.json (readable), optimizer.pt (unless None), scheduler.pt, rng.pt."""
    d = ckpt / STATE_DIR
    d.mkdir(exist_ok=True)
    (d / STATE_FILE).write_text(json.dumps(asdict(state), indent=1) + "\n")
    if optimizer is not None:  # None: sharded optimizer state, written by lcft.checkpoint.sharded
        torch.save(optimizer, d / "optimizer.pt")
    torch.save(scheduler, d / "scheduler.pt")
    torch.save(rng_state(), d / "rng.pt")


def broken(path: Path, reason: str) -> LcftError:
    """A one-line error naming a trainer-state file and the checkpoint to resume from instead."""
    ckpt = path.parent.parent if path.parent.name == STATE_DIR else path.parent
    prev = previous_checkpoint(ckpt)
    hint = f"; resume from the previous checkpoint: --resume {prev}" if prev else ""
    return LcftError(f"{path}: {reason}{hint}")


def read_state(ckpt: str | os.PathLike) -> TrainerState:
    """The TrainerState of a checkpoint folder."""
    p = Path(ckpt) / STATE_DIR / STATE_FILE
    if not p.is_file():
        raise LcftError(f"{ckpt}: not a trainer checkpoint ({STATE_DIR}/{STATE_FILE} missing)")
    try:
        data = read_json(p)
    except LcftError as e:  # not JSON, not an object, unreadable
        raise broken(p, str(e).removeprefix(f"{p}: ")) from None
    if unknown := [k for k in data if k not in {f.name for f in fields(TrainerState)}]:  # every field has a default
        raise broken(p, f"not a trainer state of this lcft version (field {shown(unknown[0], quoted=True)})")
    state = TrainerState(**data)
    if not all(isinstance(getattr(state, k), int) and not isinstance(getattr(state, k), bool)
               for k in ("step", "samples_seen", "updates", "skipped", "consecutive_skips")):
        raise broken(p, "corrupt trainer state (a count is not an integer)")
    numbers = [state.elapsed, *([state.last_loss] if state.last_loss is not None else [])]
    if not isinstance(state.guard_history, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in [*state.guard_history, *numbers]):
        raise broken(p, "corrupt trainer state (guard_history, elapsed or last_loss is not a number)")
    if state.data is not None and (why := _data_problem(state.data)):
        raise broken(p, f"corrupt trainer state ({why})")
    if why := _inconsistent(state, Path(ckpt)):
        raise broken(p, f"corrupt trainer state ({why})")
    return state


def _data_problem(data: Any) -> str | None:
    """What makes `data` other than the identity lcft records (lcft.train.run_dir.data_identity: a positive length
    and stride, and 64 lower-case hex digits for each train file, named plainly), which a resume prints; None when
    it is that."""
    if not isinstance(data, dict) or set(data) != {"length", "stride", "sha256"}:
        return "data is not the identity lcft records: length, stride and sha256"
    if bad := [k for k in ("length", "stride") if not is_count(data[k], 1)]:
        return f"data.{bad[0]} is not a positive whole number"
    digests = data["sha256"]
    if not isinstance(digests, dict):
        return "data.sha256 is not an object of file names"
    if names := [n for n in digests if not (is_plain_name(n) and n.isprintable())]:
        return f"data.sha256 names {shown(names[0], quoted=True)}, which is not a plain file name"
    if names := [n for n, v in digests.items() if not (isinstance(v, str) and SHA256.fullmatch(v))]:
        return f"data.sha256 of {names[0]} is not 64 hex digits"
    return None


def _inconsistent(state: TrainerState, ckpt: Path) -> str | None:
    """What no run writes (the counts and numbers already of their types): a negative count, updates and skips
    that do not add up to the steps, more samples than steps of the largest batch, a step other than the one
    the checkpoint folder is named after, a non-finite or negative elapsed time, a guard loss that is not finite
    (only applied updates, whose losses are finite, enter the guard's history), negative or past MAX_GUARD_LOSS."""
    counts = ("step", "samples_seen", "updates", "skipped", "consecutive_skips")
    if negative := [k for k in counts if getattr(state, k) < 0]:
        return f"{negative[0]} is negative"
    if state.updates + state.skipped != state.step or state.consecutive_skips > state.skipped:
        return (f"{state.updates} updates and {state.skipped} skipped ({state.consecutive_skips} in a row) "
                f"are not the {state.step} steps")
    if state.samples_seen > state.step * MAX_BATCH:
        return f"{state.samples_seen} samples in {state.step} steps"
    if (m := STEP_DIR.fullmatch(ckpt.name)) and int(m.group(1)) != state.step:
        return f"step {state.step} in the checkpoint of step {int(m.group(1))}"
    if not (math.isfinite(state.elapsed) and state.elapsed >= 0):
        return f"elapsed {state.elapsed!r} is not a number of seconds"
    if not all(map(math.isfinite, state.guard_history)):
        return "guard_history holds a non-finite loss"
    if not all(0 <= v <= MAX_GUARD_LOSS for v in state.guard_history):
        return f"guard_history holds a loss below 0 or above {MAX_GUARD_LOSS:.4g}"
    return None


def _load(path: Path) -> Any:
    """torch.load of plain tensors and containers only; anything else (code, other classes) is refused."""
    if not path.is_file():
        raise broken(path, "missing (incomplete checkpoint)")
    try:
        with open(path, "rb") as fh:  # torch.load inflates a deflated record whole: a few MB become gigabytes
            stored_records(fh, lambda why: broken(path, f"corrupt trainer state ({why})"))
        return torch.load(path, map_location="cpu", weights_only=True)
    except LcftError:
        raise
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e) and "GLOBAL" not in str(e):  # not a reference to code: garbled
            raise broken(path, "corrupt trainer state (not a torch file of plain tensors)") from None
        raise broken(path, "refused: it holds objects other than tensors and numbers (a crafted or foreign "
                            "file; nothing in it was run)") from None
    except Exception as e:  # torch's zip reader and pickle raise many types for a garbled file
        raise broken(path, f"corrupt trainer state ({type(e).__name__})") from None


def read_trainer_state(ckpt: str | os.PathLike) -> tuple[TrainerState, dict | None, dict, dict]:
    """(state, optimizer state dict (None: sharded, in dcp/), scheduler state dict, rng states) of a
    checkpoint folder; a one-line
    LcftError naming the file when one is missing, garbled or not plain data."""
    d = Path(ckpt) / STATE_DIR
    state = read_state(ckpt)
    sharded = not (d / "optimizer.pt").exists() and is_sharded_checkpoint(ckpt)  # optimizer state in dcp/
    optim = None if sharded else _load(d / "optimizer.pt")
    sched, rng = _load(d / "scheduler.pt"), _load(d / "rng.pt")
    for name, value, keys in (("optimizer.pt", optim, ("state", "param_groups")), ("scheduler.pt", sched, ()),
                              ("rng.pt", rng, ("python", "numpy", "torch"))):
        if value is None and name == "optimizer.pt":
            continue
        if not isinstance(value, dict) or any(k not in value for k in keys):
            raise broken(d / name, "corrupt trainer state (not the expected dictionary)")
    if not _rng_fits(rng):
        raise broken(d / "rng.pt", "corrupt trainer state (not the RNG states lcft writes)")
    return state, optim, sched, rng


def _rng_fits(rng: dict[str, Any]) -> bool:
    """Whether rng.pt holds exactly the layout `rng_state` writes, each state accepted by a scratch generator of
    its kind, so that `set_rng_state` cannot fail half-way (nor leave numpy reading past its state)."""
    try:
        return _python_fits(rng["python"]) and _numpy_fits(rng["numpy"]) and _torch_fits(rng["torch"], rng)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # what the generators raise for a bad state
        return False


def _is_int(v: Any, low: int, high: int) -> bool:
    return type(v) is int and low <= v <= high


def _words(t: Any, n: int) -> bool:
    """`n` Mersenne Twister words as rng_state keeps them: an int64 tensor of values in [0, 2**32)."""
    return (isinstance(t, torch.Tensor) and t.dtype == torch.int64 and tuple(t.shape) == (n,)
            and bool(((t >= 0) & (t < 1 << 32)).all()))


def _python_fits(py: Any) -> bool:
    """[3, (625,) words and position, None or a float]: random.getstate() of version 3."""
    if not (isinstance(py, list | tuple) and len(py) == 3 and _is_int(py[0], 3, 3) and _words(py[1], MT_WORDS + 1)
            and (py[2] is None or type(py[2]) is float)):
        return False
    random.Random().setstate(_python_state(py))
    return True


def _numpy_fits(npy: Any) -> bool:
    """["MT19937", (624,) words, position 0..624, has_gauss 0 or 1, cached gaussian]: numpy's legacy state
    (numpy does not check the position: one past the words would be read from beyond them)."""
    if not (isinstance(npy, list | tuple) and len(npy) == 5 and isinstance(npy[0], str) and npy[0] == "MT19937"
            and _words(npy[1], MT_WORDS) and _is_int(npy[2], 0, MT_WORDS) and _is_int(npy[3], 0, 1)
            and type(npy[4]) is float):
        return False
    np.random.RandomState().set_state(_numpy_state(npy))
    return True


def _torch_fits(state: Any, rng: dict[str, Any]) -> bool:
    """torch's CPU generator state (its size and content), and the CUDA ones when they would be restored."""
    if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8
            and state.shape == torch.get_rng_state().shape):
        return False
    torch.Generator().set_state(state)
    cuda = rng.get("cuda")
    if cuda is None:
        return True
    if not (isinstance(cuda, list | tuple) and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8
                                                   for t in cuda)):
        return False
    if torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        for i, t in enumerate(cuda):
            torch.Generator(device=f"cuda:{i}").set_state(t)
    return True
