"""`--shard fsdp` in the trainer: the loss model after FSDP2 sharded it (lcft.parallel.parallelize), and its
checkpoints written and read shard by shard through torch.distributed.checkpoint (lcft.parallel.dcp).

Accelerate keeps launch, accumulation and trackers; it does not wrap a sharded model (it would put DDP
around it), and its own FSDP2 path builds its mesh from its own parallelism config, which knows nothing of
lcft's cp groups and ContextParallelCore, so lcft applies fully_shard itself, over its own mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lcft.checkpoint.layout import TMP_PREFIX, checkpoints_dir, step_name
from lcft.errors import LcftError
from lcft.files import disk_full_error
from lcft.model.io import write_model_folder
from lcft.parallel.dcp import DCP_DIR, SHARDED_META, load_full_optimizer, load_state, save_state
from lcft.parallel.fsdp import clip_grad_norm
from lcft.parallel.mesh import ParallelState
from lcft.train.checkpoint import checkpoint_bytes, write_checkpoint


def materialize_sharded(loss_model: nn.Module, device: torch.device, precision: str, offload: bool,
                        init: Path | None = None) -> None:
    """After lcft.parallel.parallelize sharded `loss_model` (in place): bf16 on CPU is autocast around the
    forward, as Accelerate does unsharded (on CUDA FSDP2's mixed precision does it). A model built on the meta
    device (a sharded checkpoint to read) gets empty local shards, filled from `init` when given (else by the
    resume)."""
    cuda = device.type == "cuda"
    if precision == "bf16" and not cuda:
        loss_model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(loss_model.forward)
    if any(p.is_meta for p in loss_model.parameters()):
        loss_model.to_empty(device="cpu" if offload and cuda else device)
        if init is not None:  # collective: each rank reads its own shards
            load_state(loss_model.model, None, init, no_dist=False)


def prepare(acc: Any, loss_model: nn.Module, optimizer: torch.optim.Optimizer, layout: ParallelState
            ) -> tuple[nn.Module, Any]:
    """(model, optimizer) through Accelerate; when the layout shards, only the optimizer (it would wrap DDP
    around the sharded model)."""
    if layout.fsdp_enabled:
        return loss_model, acc.prepare(optimizer)
    return acc.prepare(loss_model, optimizer)


def clip(acc: Any, model: nn.Module, max_norm: float, layout: ParallelState) -> float:
    """Clip to the global gradient norm and return it: over the shards when the layout shards, else Accelerate's."""
    if layout.fsdp_enabled:
        return clip_grad_norm(model.parameters(), max_norm, sharded=True)
    return float(acc.clip_grad_norm_(model.parameters(), max_norm))


def restore_optimizer(model: nn.Module, optimizer: Any, ckpt: Path, saved: dict | None, sharded: bool) -> None:
    """Optimizer state of the checkpoint resumed from, onto this run's layout. saved = its optimizer.pt (None:
    the checkpoint is sharded, and the weights are read again with it, resharded). `optimizer` may be
    Accelerate's wrapper."""
    raw = getattr(optimizer, "optimizer", optimizer)
    if saved is None:
        load_state(model, raw, ckpt, no_dist=not sharded)
    elif sharded:
        load_full_optimizer(model, raw, saved)
    else:
        optimizer.load_state_dict(saved)


def save_sharded(run_dir: Path, step: int, model: nn.Module, optimizer: Any, is_main: bool,
                 write_rest: Callable[[Path], None], between: Callable[[int, Path], None] | None,
                 windows: Any = None) -> Path:
    """Collective: every rank writes its shards of the model and optimizer into the checkpoint's temp folder
    (`dcp/`); rank 0 adds config.json, lcft.json (recording the tokenizer of `windows`, the training data),
    for a model tokenizer its files (as a plain checkpoint, so AutoTokenizer and `lcft export` find them) and
    the trainer state, then renames the folder (atomic, as write_checkpoint). Nothing is gathered on one rank.
    The folder must be on a filesystem all ranks share."""
    final = checkpoints_dir(run_dir) / step_name(step)
    raw = getattr(optimizer, "optimizer", optimizer)
    tmp = checkpoints_dir(run_dir) / (TMP_PREFIX + step_name(step))

    def write_model(path: Path) -> None:
        (path / DCP_DIR).mkdir()
        dist.barrier()  # the temp folder exists: the other ranks write into it now
        save_state(model, raw, path)
        write_model_folder(path, model.config, {}, torch.float32, windows.manifest["tokenizer"] if windows else None,
                           meta=SHARDED_META)
        if getattr(windows, "per_base", False):
            from lcft.genomics.hf_tokenizer import save_hf_tokenizer

            save_hf_tokenizer(windows.tokenizer, path)

    need = checkpoint_bytes(model)
    if is_main:  # a failed save (every rank's, DCP gathers them) is one line; the temp folder goes
        return write_checkpoint(run_dir, step, write_model, write_rest, between, expected_bytes=need)
    dist.barrier()
    try:
        save_state(model, raw, tmp)
    except Exception as e:
        err = disk_full_error(e, tmp.parent, need)
        if err is None:
            raise
        raise LcftError(f"cannot save step {step}: {err}") from None
    return final
