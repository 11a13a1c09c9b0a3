"""Checkpoints of a sharded run through torch.distributed.checkpoint (DCP): each rank writes its own shards of
the model and the optimizer into `<checkpoint>/dcp/`, keyed by parameter name, so they load back on any layout
(fsdp on N ranks, fsdp on M, one process, DDP, any cp size). Reading a whole model (eval) or streaming it into
HF safetensors shards (export) needs no process group. Nothing here loads a pickle.

Beside `dcp/` a sharded checkpoint holds config.json and lcft.json (no weights), so every tool that reads a
model folder's config reads it too.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from lcft.errors import LcftError
from lcft.files import files_sha256
from lcft.model import Llama
from lcft.model.config import AttentionConfig
from lcft.model.hf import MAX_SHARD_BYTES, shards
from lcft.model.io import from_pretrained, read_config, write_model_folder
from lcft.runs import read_model_meta

DCP_DIR = "dcp"
METADATA = ".metadata"
MODEL, OPTIM = "model", "optim"  # top-level keys: DCP stores "model.<parameter name>" and "optim.state...."


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """True for a checkpoint folder written through DCP (`dcp/.metadata` present)."""
    return (Path(path) / DCP_DIR / METADATA).is_file()


def _dcp_dir(path: str | os.PathLike) -> Path:
    return Path(path) / DCP_DIR


def save_state(model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: str | os.PathLike) -> None:
    """Collective: every rank writes its shards of `model`'s parameters and the optimizer state (keyed by
    parameter name) into `<ckpt>/dcp/`. `model` is the module whose names the checkpoint keeps (the Llama,
    not a wrapper)."""
    state = {MODEL: get_model_state_dict(model), OPTIM: get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=str(_dcp_dir(ckpt)))


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, ckpt: str | os.PathLike,
               *, no_dist: bool) -> None:
    """Fill `model` (and the optimizer) from `<ckpt>/dcp/`, resharded to this process's layout: FSDP shards of
    any world size, or whole tensors (no_dist: each process reads on its own, no collective). Parameters
    must be materialised (not on the meta device)."""
    state: dict[str, Any] = {MODEL: get_model_state_dict(model)}
    if optimizer is not None:
        state[OPTIM] = get_optimizer_state_dict(model, optimizer)  # creates the AdamW moments to read into
    try:
        _load(state, ckpt, no_dist)
    except Exception as e:  # CheckpointException wraps per-rank errors: a missing key, a torn file
        raise LcftError(f"{ckpt}: sharded checkpoint unreadable ({type(e).__name__}: {str(e)[:300]})") from None
    set_model_state_dict(model, state[MODEL])
    if optimizer is not None:
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


def _model_on_meta(ckpt: Path, attention: AttentionConfig | None) -> Llama:
    with torch.device("meta"):
        return Llama(read_config(ckpt, attention))


def read_tensors(ckpt: str | os.PathLike, names: list[str]) -> dict[str, torch.Tensor]:
    """The named parameters (whole, as stored) of a sharded checkpoint, read in this process alone."""
    md = dcp.FileSystemReader(str(_dcp_dir(ckpt))).read_metadata().state_dict_metadata
    out: dict[str, torch.Tensor] = {}
    for n in names:
        meta = md.get(f"{MODEL}.{n}")
        if meta is None:
            raise LcftError(f"{ckpt}: sharded checkpoint has no weight {n!r}")
        out[n] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    _load(dcp_state={MODEL: out}, ckpt=ckpt, no_dist=True)
    return out


def _load(dcp_state: dict[str, Any], ckpt: str | os.PathLike, no_dist: bool) -> None:
    with warnings.catch_warnings():  # DCP warns that it reads in one process: that is what no_dist asks
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(dcp_state, checkpoint_id=str(_dcp_dir(ckpt)), no_dist=no_dist)


def read_model(ckpt: str | os.PathLike, attention: AttentionConfig | None = None, *,
               materialize: bool = True, dtype: torch.dtype | None = None) -> Llama:
    """The model of any checkpoint folder: HF safetensors (lcft.model.from_pretrained) or sharded DCP.
    materialize=False leaves a sharded checkpoint's model on the meta device, for a caller that shards it
    first and then fills each rank's part with load_state (no rank holds the whole model)."""
    ckpt = Path(ckpt)
    if not is_sharded_checkpoint(ckpt):
        return from_pretrained(ckpt, attention=attention, dtype=dtype)
    model = _model_on_meta(ckpt, attention)
    if materialize:
        model.to_empty(device="cpu")
        load_state(model, None, ckpt, no_dist=True)
    return model


def _model_metadata(ckpt: Path) -> dict[str, Any]:
    """{parameter name: DCP tensor metadata (size, dtype)} of the model in a sharded checkpoint."""
    try:
        md = dcp.FileSystemReader(str(_dcp_dir(ckpt))).read_metadata()
    except Exception as e:  # a torn or foreign .metadata
        raise LcftError(f"{ckpt}: sharded checkpoint unreadable ({type(e).__name__}: {e})") from None
    prefix = MODEL + "."
    return {k[len(prefix):]: v for k, v in md.state_dict_metadata.items() if k.startswith(prefix)}


def check_sharded_readable(ckpt: str | os.PathLike) -> None:
    """Cheap checks before any evaluation: the metadata reads, it holds every parameter of config.json's model
    with its shape, and every shard file it names is present."""
    ckpt = Path(ckpt)
    stored = _model_metadata(ckpt)
    for name, p in _model_on_meta(ckpt, None).named_parameters():
        if name not in stored:
            raise LcftError(f"unreadable checkpoint {ckpt}: no weight {name!r} in {DCP_DIR}/")
        if tuple(stored[name].size) != tuple(p.shape):
            raise LcftError(f"unreadable checkpoint {ckpt}: weight {name} has shape {tuple(stored[name].size)}, "
                            f"config.json implies {tuple(p.shape)}")
    md = dcp.FileSystemReader(str(_dcp_dir(ckpt))).read_metadata()
    files = {getattr(s, "relative_path", None) for s in (md.storage_data or {}).values()} - {None}
    missing = sorted(f for f in files if not (_dcp_dir(ckpt) / f).is_file())
    if missing:
        raise LcftError(f"unreadable checkpoint {ckpt}: shard file(s) missing in {DCP_DIR}/: {', '.join(missing)}")


def export_sharded(ckpt: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype | None = None,
                   force: bool = False, max_shard_size: int = MAX_SHARD_BYTES) -> Path:
    """Write a sharded checkpoint's model as an HF folder, one safetensors shard at a time (peak memory: about
    one output shard plus the largest tensor; the whole model is never in memory)."""
    ckpt, out = Path(ckpt), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise LcftError(f"{out} already exists and is not empty (use --force to overwrite)")
    check_sharded_readable(ckpt)
    model = _model_on_meta(ckpt, None)  # names, shapes and the shard plan; no storage
    stored = next(iter(_model_metadata(ckpt).values())).properties.dtype
    files = shards(model, dtype or stored, max_shard_size, read=lambda names: read_tensors(ckpt, names))
    tokenizer = read_model_meta(ckpt).get("tokenizer")  # keep the recorded vocabulary
    return write_model_folder(out, model.config, files, dtype or stored, tokenizer)


def sharded_weights_sha256(ckpt: str | os.PathLike) -> str:
    """sha256 over the files of `<ckpt>/dcp/` in name order (names and file hashes)."""
    return files_sha256([p for p in _dcp_dir(ckpt).iterdir() if p.is_file()])
