"""Checkpoints of a sharded (`--shard fsdp`) run: every rank writes its own shards through
torch.distributed.checkpoint (lcft.checkpoint.dcp) into the checkpoint's temp folder, rank 0 the rest and the
rename (lcft.checkpoint.save)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lcft.checkpoint.dcp import save_state
from lcft.checkpoint.hf_folder import hf_tokenizer_of, write_model_folder
from lcft.checkpoint.layout import TMP_PREFIX, checkpoints_dir, step_name
from lcft.checkpoint.model_files import DCP_DIR, SHARDED_META
from lcft.checkpoint.save import checkpoint_bytes, write_checkpoint
from lcft.disk import disk_full_error
from lcft.errors import LcftError


def save_sharded(run_dir: Path, step: int, model: nn.Module, optimizer: Any, is_main: bool,
                 write_rest: Callable[[Path], None], between: Callable[[int, Path], None] | None,
                 windows: Any = None, warn: Callable[[str], None] | None = None,
                 generation: bytes | None = None) -> Path:
    """Collective: every rank writes its shards of the model and optimizer into the checkpoint's temp folder
    (`dcp/`); rank 0 adds config.json, lcft.json (recording the tokenizer of `windows`, the training data),
    for a model tokenizer its files (as a plain checkpoint, so AutoTokenizer and `lcft export` find them), the
    generation_config.json `generation` of the model the run started from (None: none) and the trainer state,
    then renames the folder (atomic, as write_checkpoint). Nothing is gathered on one rank. The folder must be on
    a filesystem all ranks share. `warn`: write_checkpoint's."""
    final = checkpoints_dir(run_dir) / step_name(step)
    raw = getattr(optimizer, "optimizer", optimizer)
    tmp = checkpoints_dir(run_dir) / (TMP_PREFIX + step_name(step))

    def write_model(path: Path) -> None:
        (path / DCP_DIR).mkdir()
        dist.barrier()  # the temp folder exists: the other ranks write into it now
        save_state(model, raw, path)
        write_model_folder(path, model.config, {}, torch.float32, windows.manifest["tokenizer"] if windows else None,
                           meta=SHARDED_META, hf_tokenizer=hf_tokenizer_of(windows) if windows else None,
                           generation=generation)

    need = checkpoint_bytes(model)
    if is_main:  # a failed save (every rank's, DCP gathers them) is one line; the temp folder goes
        return write_checkpoint(run_dir, step, write_model, write_rest, between, expected_bytes=need, warn=warn)
    dist.barrier()
    try:
        save_state(model, raw, tmp)
    except Exception as e:
        err = disk_full_error(e, tmp.parent, need)
        if err is None:
            raise
        raise LcftError(f"cannot save step {step}: {err}") from None
    return final
