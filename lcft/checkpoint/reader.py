"""One reader of model folders and checkpoints for train (--init, --resume), eval and export: `load(path)` decides
plain or sharded (only lcft.json's "weights": "dcp" makes a folder sharded) and returns what the caller asks for."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.layout import Identity, read_model_config, read_model_meta, unchanged
from lcft.checkpoint.model_files import is_sharded_checkpoint, read_generation_config
from lcft.checkpoint.state import TrainerState, read_trainer_state
from lcft.errors import LcftError, is_oom
from lcft.model import Llama
from lcft.model.config import AttentionConfig


@dataclass
class Loaded:
    """What `load` read from one checkpoint folder."""

    path: Path
    config: dict[str, Any]
    """config.json as recorded."""
    meta: dict[str, Any]
    """lcft.json (attention settings, the tokenizer spec, "weights"); {} for a folder transformers wrote."""
    sharded: bool
    """The weights are DCP shards in dcp/ (lcft.json says "weights": "dcp"), not safetensors."""
    model: Llama | None = None
    """The model (model=True); a sharded one stays on the meta device with materialize=False."""
    trainer: tuple[TrainerState, dict | None, dict, dict] | None = None
    """(state, optimizer state dict (None: sharded, in dcp/), scheduler state dict, RNG states) (trainer_state=True)."""
    generation: bytes | None = None
    """generation_config.json as stored, which checkpoints and exports of the model carry; None: the folder has none."""
    identity: Identity = None
    """The folder's identity as read (lcft.checkpoint.layout.unchanged): a later read of it compares with it."""

    @property
    def tokenizer(self) -> dict[str, Any] | None:
        """The tokenizer spec the folder records (None for a folder transformers wrote)."""
        return self.meta.get("tokenizer")


def load(path: str | os.PathLike, *, model: bool = True, attention: AttentionConfig | None = None,
         dtype: torch.dtype | None = None, materialize: bool = True, trainer_state: bool = False,
         since: Identity = None) -> Loaded:
    """Read a checkpoint folder (as lcft.checkpoint.layout.resolve_checkpoint / resolve_resume gave it: a run or
    Hub id is resolved, and checksums verified, there). model: build the model, from HF safetensors
    (from_pretrained: attention overrides lcft.json's, dtype casts as read) or from DCP shards read in this
    process alone; materialize=False leaves a sharded model on the meta device, for a caller that shards it and
    then fills each rank's part (lcft.checkpoint.dcp.load_state). trainer_state: also the trainer state, optimizer,
    schedule and RNG states (a one-line error when the folder holds none). A folder removed or replaced while
    read (or since `since`, its identity when the caller first read it) is a one-line error saying so."""
    path = Path(path)
    with unchanged(path, since) as identity:
        out = Loaded(path, read_model_config(path), read_model_meta(path), is_sharded_checkpoint(path),
                     generation=read_generation_config(path), identity=identity)
        if model:
            out.model = _read_model(path, out.sharded, attention, dtype, materialize)
        if trainer_state:
            out.trainer = read_trainer_state(path)
    return out


def _read_model(path: Path, sharded: bool, attention: AttentionConfig | None, dtype: torch.dtype | None,
                materialize: bool) -> Llama:
    if not sharded:
        return from_pretrained(path, attention=attention, dtype=dtype)
    from lcft.checkpoint.dcp import check_sharded_readable, load_state, model_on_meta  # (torch.distributed)

    # names and shapes as config.json says, stored bytes there: before building (even on the meta device: a
    # config.json of 16 layers x 1024 experts beside a small checkpoint built for seconds) or allocating anything
    check_sharded_readable(path)
    model = model_on_meta(path, attention)
    if materialize:
        try:
            model.to_empty(device="cpu")
            load_state(model, None, path, no_dist=True)
        except (RuntimeError, MemoryError) as e:
            if not is_oom(e):
                raise
            raise LcftError(f"{path}: not enough memory to read the model ({model.num_parameters():,} "
                            "parameters)") from None
    return model
