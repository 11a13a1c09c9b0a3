"""Resuming a run: a checkpoint's optimizer and schedule states checked against what this run built, then the
trainer state, optimizer (onto this run's layout), schedule and RNGs restored, with this run's options kept."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lcft.checkpoint.layout import STATE_DIR
from lcft.checkpoint.model_files import DCP_DIR
from lcft.checkpoint.reader import load
from lcft.checkpoint.state import TrainerState, broken, set_rng_state
from lcft.errors import LcftError, shown
from lcft.lazy import is_loaded_instance
from lcft.liveness import scalar_device

ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")  # what AdamW keeps per parameter (and max_exp_avg_sq: amsgrad)
NONNEGATIVE = ("exp_avg_sq", "max_exp_avg_sq")  # Adam's second moments: running means of squares
WRAPPERS = r"^module\.|(?:_orig_mod|_checkpoint_wrapped_module|_fsdp_wrapped_module)\."


def restore_training(ckpt: Path, model: nn.Module, optimizer: Any, scheduler: Any, sharded: bool) -> TrainerState:
    """The trainer state of the checkpoint resumed from, its optimizer, schedule and RNGs put back into this run's
    (`optimizer` may be Accelerate's wrapper; `sharded`: this run's FSDP layout). Both states are checked before
    anything is restored; this run's options (lr, betas, warm-up...) then apply from the next step."""
    raw = getattr(optimizer, "optimizer", optimizer)
    built = optimizer_options(raw)
    state, optim, sched, rng = load(ckpt, model=False, trainer_state=True).trainer
    names = param_names(model, raw)
    check_restorable(ckpt, raw, scheduler, state, optim, sched, names)
    restore_optimizer(model, optimizer, ckpt, optim, sharded, names)
    scheduler.load_state_dict(sched)
    set_rng_state(rng)
    reapply_options(raw, scheduler, built)
    return state


def restore_optimizer(model: nn.Module, optimizer: Any, ckpt: Path, saved: dict | None, sharded: bool,
                      names: list[str]) -> None:
    """Optimizer state of the checkpoint resumed from, onto this run's layout. saved = its optimizer.pt (None:
    the checkpoint is sharded, and the weights are read again with it, resharded). `optimizer` may be
    Accelerate's wrapper; `names`: its parameters' (`param_names`), for a message."""
    raw = getattr(optimizer, "optimizer", optimizer)
    if saved is None:
        from lcft.checkpoint.dcp import load_state  # (torch.distributed.checkpoint: sharded only)

        load_state(model, raw, ckpt, no_dist=not sharded)
        check_loaded_values(ckpt, raw, names)
    elif sharded:
        from lcft.checkpoint.dcp import load_full_optimizer

        load_full_optimizer(model, raw, saved)
    else:
        optimizer.load_state_dict(saved)


def check_loaded_values(ckpt: Path, optimizer: torch.optim.Optimizer, names: list[str]) -> None:
    """A sharded checkpoint's moments as DCP put them into this process's optimizer (its shards of them), judged
    as an optimizer.pt's are before loading (`_bad_values`); every rank holds other shards, so all agree through
    one all-reduce on the first parameter (in the optimizer's order, `names` theirs) any rank found one in, and
    stop together."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    found = next(((i, f"{shown(name)} of {names[i]} {why}") for i, p in enumerate(params)
                  for name, t in optimizer.state.get(p, {}).items()
                  if isinstance(t, torch.Tensor) and (why := _bad_values(name, _local(t)))), None)
    first = (found[0], 0) if found else None  # (parameter, the lowest rank that found a value in it)
    if dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
        lowest = torch.tensor([found[0] * world + rank if found else len(params) * world], device=scalar_device())
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        first = divmod(int(lowest.item()), world) if int(lowest.item()) < len(params) * world else None
    if first is not None:
        said = found[1] if found and found[0] == first[0] else (
            f"a moment of {names[first[0]]} on rank {first[1]} holds a non-finite or negative value")
        raise LcftError(f"{ckpt}/{DCP_DIR}: corrupt optimizer state ({said})")


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimizer's parameters' names in the model, in its order, as a checkpoint keys them: without the
    segments wrappers add (DDP's leading `module.`, compile's and activation checkpointing's)."""
    by_id = {id(p): re.sub(WRAPPERS, "", n) for n, p in model.named_parameters()}
    return [by_id.get(id(p), f"parameter {i}") for i, p in enumerate(p for g in optimizer.param_groups
                                                                       for p in g["params"])]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP state tensor (a DTensor), or the tensor."""
    return t.to_local() if is_loaded_instance(t, "torch.distributed.tensor", "DTensor") else t


def check_restorable(ckpt: str | os.PathLike, optimizer: torch.optim.Optimizer, scheduler: Any, state: TrainerState,
                     optim: dict | None, sched: dict, names: list[str]) -> None:
    """Before anything is restored: refuse, in one line naming the file, a scheduler.pt or optimizer.pt that
    torch reads as plain data but that is not what this run's schedule and optimizer write (loaded, it would fail
    in torch's load_state_dict or in a later step, or set the schedule elsewhere than the trainer state says).
    The oracle is what this run built: its schedule's state_dict and its optimizer's parameters (`names` theirs,
    as `param_names` gives them, for the message)."""
    d = Path(ckpt) / STATE_DIR
    if why := _schedule_misfit(scheduler, sched, state.updates):
        raise broken(d / "scheduler.pt", f"corrupt trainer state ({why})")
    if optim is not None and (why := _optimizer_misfit(optimizer, optim, names)):
        raise broken(d / "optimizer.pt", f"corrupt trainer state ({why})")


def _same_kind(saved: Any, built: Any) -> bool:
    """`saved` has `built`'s type, a list its length and its items' kinds, a float is finite."""
    if type(saved) is not type(built):
        return False
    if isinstance(built, list):
        return len(saved) == len(built) and all(map(_same_kind, saved, built))
    return not isinstance(built, float) or math.isfinite(saved)


def _schedule_misfit(scheduler: Any, saved: dict, updates: int) -> str | None:
    built = scheduler.state_dict()
    for key, value in saved.items():
        if key in built:
            if not _same_kind(value, built[key]):
                return f"{shown(key)} is not what the schedule keeps"
        elif type(key) is not str or hasattr(scheduler, key) or type(value) not in (bool, int, float, type(None)):
            return f"entry {shown(key)} is not the schedule's"  # another torch's bookkeeping numbers pass
    if missing := [k for k in ("base_lrs", "last_epoch", "lr_lambdas") if k not in saved]:
        return f"no {missing[0]}"
    if saved["last_epoch"] != updates:
        return f"the schedule is at update {shown(saved['last_epoch'])}, the trainer state at {updates}"
    return None


def _optimizer_misfit(optimizer: torch.optim.Optimizer, saved: dict, names: list[str]) -> str | None:
    """torch numbers the parameters 0, 1, ... across the groups: each id of the file must be the one this run's
    optimizer has at that place, each group option a plain value, each parameter's state none or all of what
    AdamW keeps (torch indexes each of them), each tensor a scalar `step` or one of its parameter's shape."""
    groups, params = saved["param_groups"], [p for g in optimizer.param_groups for p in g["params"]]
    kept = [ADAM_STATE + ("max_exp_avg_sq",) * bool(g.get("amsgrad")) for g in optimizer.param_groups
            for _ in g["params"]]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    expected = [list(range(sum(sizes[:k]), sum(sizes[:k + 1]))) for k in range(len(sizes))]
    if not isinstance(groups, list) or [_ids(g) for g in groups] != expected:
        return f"not the {len(sizes)} parameter group(s) of {sizes} parameters this model has"
    if bad := [k for g in groups for k, v in g.items() if k != "params" and not (type(k) is str and _plain(v))]:
        return f"param group option {shown(bad[0])} is not a plain value"  # torch's load_state_dict reads some
    if not isinstance(saved["state"], dict):
        return "its state is not a table of parameters"
    for i, entry in saved["state"].items():
        if type(i) is not int or not 0 <= i < len(params) or not isinstance(entry, dict):
            return f"state of {shown(i)}, not a parameter of this model"
        if entry and set(entry) != set(kept[i]):
            return f"the state of {names[i]} is not AdamW's ({', '.join(kept[i])})"
        for name, t in entry.items():
            want = () if name == "step" else params[i].shape
            if not (isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.shape == want):
                return f"{shown(name)} of {names[i]} is not a float tensor of shape {tuple(want)}"
            if why := _bad_values(name, t):
                return f"{shown(name)} of {names[i]} {why}"
    return None


def _ids(group: Any) -> list[int] | None:
    """A saved param group's parameter ids: a list of ints (None for anything else, a tensor among them too)."""
    ids = group.get("params") if isinstance(group, dict) else None
    return ids if isinstance(ids, list) and all(type(i) is int for i in ids) else None


def _plain(v: Any) -> bool:
    """What an optimizer option holds: None, a bool, int, finite float or string, or a list or tuple of them."""
    if isinstance(v, list | tuple):
        return all(not isinstance(x, list | tuple) and _plain(x) for x in v)
    return v is None or type(v) in (bool, int, str) or (type(v) is float and math.isfinite(v))


def _bad_values(name: str, t: torch.Tensor) -> str | None:
    """What no update writes: a non-finite moment or step (the spike guard skips a non-finite loss or gradient
    norm, so a run never applies one), a negative second moment or step. Loaded, either makes every later
    update non-finite, each skipped, until the run stops."""
    if not bool(torch.isfinite(t).all()):
        return "holds a non-finite value"
    if (name == "step" or name in NONNEGATIVE) and bool((t < 0).any()):
        return "holds a negative value"
    return None


def optimizer_options(optimizer: Any) -> list[dict[str, Any]]:
    """The options of each param group (lr, betas, eps, weight decay...) as this run built them: taken before
    a saved state is loaded over them, given back to `reapply_options` after."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def reapply_options(optimizer: Any, scheduler: Any, built: list[dict[str, Any]]) -> None:
    """After loading a saved optimizer and schedule: put back this run's options, so changed ones apply from
    the next step; the schedule continues from its position (applied updates) with this run's peak lr,
    warm-up and decay. Unchanged options give back exactly the saved values (exact resume)."""
    for group, options in zip(optimizer.param_groups, built, strict=True):
        group.update(options)
    scheduler.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)  # what LambdaLR computes at this position
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
