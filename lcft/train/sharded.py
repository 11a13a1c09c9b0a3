"""`--shard fsdp` in the trainer: the loss model after FSDP2 sharded it (lcft.parallel.parallelize); its
checkpoints are written and read shard by shard by lcft.checkpoint.sharded.

Accelerate keeps launch, accumulation and trackers; it does not wrap a sharded model (it would put DDP
around it), and its own FSDP2 path builds its mesh from its own parallelism config, which knows nothing of
lcft's cp groups and ContextParallelCore, so lcft applies fully_shard itself, over its own mesh.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lcft.checkpoint.layout import unchanged
from lcft.checkpoint.reader import Loaded
from lcft.parallel.mesh import ParallelState


def materialize_sharded(loss_model: nn.Module, device: torch.device, precision: str, offload: bool,
                        init: Loaded | None = None) -> None:
    """After lcft.parallel.parallelize sharded `loss_model` (in place): bf16 on CPU is autocast around the
    forward, as Accelerate does unsharded (on CUDA FSDP2's mixed precision does it). A model built on the meta
    device (a sharded checkpoint to read) gets empty local shards, filled from `init` when given (else by the
    resume), read as the folder its config was read from (another run pruning it meanwhile: one line)."""
    cuda = device.type == "cuda"
    if precision == "bf16" and not cuda:
        loss_model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(loss_model.forward)
    if any(p.is_meta for p in loss_model.parameters()):
        loss_model.to_empty(device="cpu" if offload and cuda else device)
        if init is not None:  # collective: each rank reads its own shards
            from lcft.checkpoint.dcp import load_state  # (torch.distributed.checkpoint: sharded runs only)

            with unchanged(init.path, init.identity):
                load_state(loss_model.model, None, init.path, no_dist=False)


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
        from lcft.parallel.fsdp import clip_grad_norm  # (torch.distributed.fsdp: sharded runs only)

        return clip_grad_norm(model.parameters(), max_norm, sharded=True)
    return float(acc.clip_grad_norm_(model.parameters(), max_norm))
