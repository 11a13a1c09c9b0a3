"""Checkpoints of a sharded run through torch.distributed.checkpoint (DCP): each rank writes its own shards of
the model and the optimizer into `<checkpoint>/dcp/`, keyed by parameter name, so they load back on any layout
(fsdp on N ranks, fsdp on M, one process, DDP, any cp size). Reading a whole model (eval) or streaming it into
HF safetensors shards (lcft.checkpoint.export) needs no process group. Nothing here runs code from a file: DCP's `.metadata`
is read by lcft.checkpoint.dcp_metadata's restricted unpickler, only tensors are stored in `dcp/`, and the
optimizer's param groups (numbers, flags, parameter names) are kept as JSON (`dcp/param_groups.json`).

Beside `dcp/` a sharded checkpoint holds config.json and lcft.json (no weights; lcft.json's "weights" says
"dcp"), so every tool that reads a model folder's config reads it too. A folder counts as sharded only when its
lcft.json says so: a stray `dcp/.metadata` in a downloaded folder is never read.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from lcft.checkpoint.dcp_metadata import SafePlanner, SafeReader, read_metadata_file
from lcft.checkpoint.hf_folder import read_config
from lcft.checkpoint.model_files import DCP_DIR, METADATA, PARAM_GROUPS, sharded_weight_files
from lcft.errors import LcftError, reason, shown
from lcft.files import atomic_write, present, read_json
from lcft.hashing import files_sha256
from lcft.model.config import AttentionConfig
from lcft.model.hf_params import check_declared
from lcft.model.llama import Llama

MODEL, OPTIM = "model", "optim"  # top-level keys: DCP stores "model.<parameter name>" and "optim.state...."


def _dcp_dir(path: str | os.PathLike) -> Path:
    return Path(path) / DCP_DIR


def save_state(model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: str | os.PathLike) -> None:
    """Collective: every rank writes its shards of `model`'s parameters and the optimizer state (keyed by
    parameter name) into `<ckpt>/dcp/`. `model` is the module whose names the checkpoint keeps (the Llama,
    not a wrapper)."""
    optim = get_optimizer_state_dict(model, optimizer)
    groups = optim.pop("param_groups")  # numbers and names: JSON, so that dcp/ holds tensors only
    try:
        dcp.save({MODEL: get_model_state_dict(model), OPTIM: optim}, checkpoint_id=str(_dcp_dir(ckpt)))
    except CheckpointException as e:  # a BaseException: give the caller the rank's own error (ENOSPC...)
        raise first_failure(e) from None
    if not dist.is_initialized() or dist.get_rank() == 0:
        atomic_write(_dcp_dir(ckpt) / PARAM_GROUPS, json.dumps(groups, indent=1))


def _param_groups(ckpt: str | os.PathLike, built: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved param groups (JSON) over this optimizer's own (`built`): same parameter names, each saved
    option that this optimizer has, as its type (a tuple stays a tuple). No file (a checkpoint written before
    they were kept as JSON): the groups as built (the schedule sets the learning rate again)."""
    path = _dcp_dir(ckpt) / PARAM_GROUPS
    if not present(path):  # (one that is no file: refused, not the groups as built)
        return built
    saved = read_json(path, want=list)  # unreadable, not JSON, nested too deep, not a list: one line naming it
    if len(saved) != len(built) or not all(isinstance(g, dict) for g in saved):
        raise LcftError(f"{path}: not {len(built)} param group(s) of this optimizer")
    out = []
    for have, got in zip(built, saved, strict=True):
        if got.get("params") != have["params"]:
            raise LcftError(f"{path}: the param groups name other parameters than this model's")
        group = dict(have)
        for k, v in got.items():
            if k != "params" and k in have:
                group[k] = tuple(v) if isinstance(have[k], tuple) and isinstance(v, list) else v
        out.append(group)
    return out


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, ckpt: str | os.PathLike,
               *, no_dist: bool) -> None:
    """Fill `model` (and the optimizer) from `<ckpt>/dcp/`, resharded to this process's layout: FSDP shards of
    any world size, or whole tensors (no_dist: each process reads on its own, no collective). Parameters
    must be materialised (not on the meta device)."""
    state: dict[str, Any] = {MODEL: get_model_state_dict(model)}
    groups: list[dict[str, Any]] = []
    if optimizer is not None:
        state[OPTIM] = get_optimizer_state_dict(model, optimizer)  # creates the AdamW moments to read into
        groups = state[OPTIM].pop("param_groups")  # not from dcp/: JSON beside it
    _load(state, ckpt, no_dist)
    set_model_state_dict(model, state[MODEL])
    if optimizer is not None:
        state[OPTIM]["param_groups"] = _param_groups(ckpt, groups)
        set_optimizer_state_dict(model, optimizer, state[OPTIM])


def load_full_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load an optimizer state dict saved with integer parameter ids (torch's own format, a one-process or DDP
    run's optimizer.pt) into an optimizer over the same parameters in the same order, now possibly sharded."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    saved_ids = [i for g in saved["param_groups"] for i in g["params"]]
    if len(saved_ids) != len(order):
        raise LcftError(f"optimizer state covers {len(saved_ids)} parameters, the model has {len(order)}")
    fqn = dict(zip(saved_ids, order, strict=True))
    full = {"state": {fqn[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**g, "params": [fqn[i] for i in g["params"]]} for g in saved["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def model_on_meta(ckpt: Path, attention: AttentionConfig | None) -> Llama:
    """The model config.json describes, on the meta device (names and shapes; no storage)."""
    with torch.device("meta"):
        return Llama(read_config(ckpt, attention))


def read_tensors(ckpt: str | os.PathLike, names: list[str]) -> dict[str, torch.Tensor]:
    """The named parameters (whole, as stored) of a sharded checkpoint, read in this process alone."""
    md = read_metadata_file(_dcp_dir(ckpt) / METADATA).state_dict_metadata
    out: dict[str, torch.Tensor] = {}
    for n in names:
        meta = md.get(f"{MODEL}.{n}")
        if meta is None:
            raise LcftError(f"{ckpt}: sharded checkpoint has no weight {n!r}")
        out[n] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    _load(dcp_state={MODEL: out}, ckpt=ckpt, no_dist=True)
    return out


def _load(dcp_state: dict[str, Any], ckpt: str | os.PathLike, no_dist: bool) -> None:
    """dcp.load through the restricted reader and planner; every failure is one LcftError (CheckpointException,
    which wraps each rank's error, derives from BaseException: an `except Exception` never sees it)."""
    reader = SafeReader(str(_dcp_dir(ckpt)))
    try:
        with warnings.catch_warnings():  # DCP warns that it reads in one process: that is what no_dist asks
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(dcp_state, storage_reader=reader, planner=SafePlanner(), no_dist=no_dist)
    except CheckpointException as e:
        raise reader.refusal or _one_line(ckpt, e) from None
    except LcftError:
        raise
    except Exception as e:  # a missing key, a torn shard file, a shape that does not fit
        if reader.refusal:
            raise reader.refusal from None
        raise LcftError(f"{ckpt}: sharded checkpoint unreadable ({type(e).__name__}: {reason(e)})") from None


def first_failure(e: CheckpointException) -> BaseException:
    """The error a CheckpointException wraps (an LcftError first, else the lowest rank's): torch's exception
    derives from BaseException, so `except Exception` (a save's cleanup, the CLI) would never see it."""
    errors = [exc for _, (exc, _) in sorted(e.failures.items())]
    return next((x for x in errors if isinstance(x, LcftError)), errors[0] if errors else RuntimeError(str(e)))


def _one_line(ckpt: str | os.PathLike, e: CheckpointException) -> LcftError:
    """The first rank's own error of a CheckpointException, as one line (an LcftError as it is)."""
    first = first_failure(e)
    if isinstance(first, LcftError):
        return first
    return LcftError(f"{ckpt}: sharded checkpoint unreadable ({type(first).__name__}: {reason(first)})")


def check_sharded_readable(ckpt: str | os.PathLike) -> torch.dtype:
    """Cheap checks before any model is built or evaluated: the metadata reads, its model entries are the
    parameters config.json implies with their shapes (lcft.model.hf_params.check_declared, as for a weight file's
    header), all in one dtype (the one an export writes), and every shard file it names is present. Returns that
    dtype."""
    ckpt = Path(ckpt)
    md = read_metadata_file(_dcp_dir(ckpt) / METADATA)
    prefix = MODEL + "."
    stored = {k: v for k, v in md.state_dict_metadata.items() if k.startswith(prefix)}
    if byte := next((k for k, v in stored.items() if not isinstance(v, TensorStorageMetadata)), None):
        raise LcftError(f"unreadable checkpoint {ckpt}: {DCP_DIR}/{METADATA} stores {shown(byte, quoted=True)} as "
                        "bytes, not a tensor; lcft stores every weight as a tensor")
    dtypes = sorted({str(m.properties.dtype).removeprefix("torch.") for m in stored.values()})
    if len(dtypes) > 1:
        raise LcftError(f"unreadable checkpoint {ckpt}: its weights are stored in {len(dtypes)} dtypes "
                        f"({', '.join(dtypes)}); lcft writes one")
    declared = ((_dcp_dir(ckpt) / METADATA, k, tuple(v.size)) for k, v in stored.items())
    check_declared(read_config(ckpt), _dcp_dir(ckpt) / METADATA, declared, stored_name=lambda n: prefix + n)
    files = {getattr(s, "relative_path", None) for s in (md.storage_data or {}).values()} - {None}
    missing = sorted(f for f in files if not (_dcp_dir(ckpt) / f).is_file())
    if missing:
        raise LcftError(f"unreadable checkpoint {ckpt}: shard file(s) missing in {DCP_DIR}/: {', '.join(missing)}")
    return next(iter(stored.values())).properties.dtype  # (check_declared refuses a model with no entries)


def sharded_weights_sha256(ckpt: str | os.PathLike) -> str:
    """sha256 over the files of `<ckpt>/dcp/` in name order (names and file hashes), param groups aside."""
    return files_sha256(sharded_weight_files(Path(ckpt)))
