"""`parallelize`: everything that turns a built single-process model into this rank's part of a run, applied from
outside and in one fixed order (as torchtitan's parallelize_llama):

1. context parallelism: each block's attention core swapped for a ContextParallelCore (lcft.parallel.apply);
2. activation checkpointing, activation offload and sequence chunks (lcft.parallel.activations);
3. compile of each block's token-wise regions (lcft.parallel.compile), around whichever core a block now holds;
4. FSDP2 over the layout's flattened dp x cp mesh (lcft.parallel.fsdp), whose hooks sit around all of it.

Train and eval both call it and both get the same ContextParallelRunner back to shard their windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lcft.parallel.activations import DEFAULT_SEQ_CHUNK, apply_activation_checkpointing
from lcft.parallel.apply import ContextParallelRunner, apply_context_parallel
from lcft.parallel.compile import compile_blocks
from lcft.parallel.config import Checkpointing, CpConfig
from lcft.parallel.mesh import ParallelState


@dataclass(frozen=True)
class ParallelizeConfig:
    """What parallelize applies beyond the layout's own degrees (the defaults change nothing)."""

    parallel: CpConfig = field(default_factory=CpConfig)
    """cp, cp_layout, cp_kv: how one window is split (cp must be the layout's)."""
    checkpointing: Checkpointing = "none"
    """'block': recompute each block in backward, keeping only its input."""
    offload_activations: bool = False
    """Keep what backward needs in CPU memory."""
    offload_dtype: torch.dtype | None = None
    """With 'block' and offload: the dtype of the host copies of the block inputs (None = their own)."""
    seq_chunk: int = DEFAULT_SEQ_CHUNK
    """With 'block': tokens per chunk of a block's token-wise work (0 = whole sequence)."""
    compile: bool = False
    """torch.compile each block's token-wise regions."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the model runs (compile's target; FSDP's policies apply on CUDA only)."""
    bf16_params: bool = False
    """Under FSDP: bf16 compute with fp32 master weights and reduction (MixedPrecisionPolicy)."""
    offload_params: bool = False
    """Under FSDP: sharded parameters, gradients and optimizer state in CPU memory (CPUOffloadPolicy)."""


def parallelize(model: nn.Module, layout: ParallelState, cfg: ParallelizeConfig,
                root: nn.Module | None = None) -> ContextParallelRunner:
    """Apply, in place and in this order, CP, activation checkpointing, compile and (when the layout shards)
    FSDP to the lcft Llama `model`; returns the runner that shards windows for it. `root`: the module whose
    forward the step calls (the train step's loss model around `model`; default `model`), which FSDP shards
    last so its hooks gather the parameters outside the blocks."""
    apply_context_parallel(model, layout, cfg.parallel)
    apply_activation_checkpointing(model, cfg.checkpointing, cfg.offload_activations, cfg.seq_chunk, cfg.offload_dtype)
    if cfg.compile:
        compile_blocks(model, cfg.device)
    if layout.fsdp_enabled:
        from lcft.parallel.fsdp import apply_fsdp  # (torch.distributed.fsdp and DTensor: sharded runs only)

        cuda = cfg.device.type == "cuda"
        apply_fsdp(model if root is None else root, model.layers, layout.shard_mesh(), bf16=cfg.bf16_params and cuda,
                   offload=cfg.offload_params and cuda)
    return ContextParallelRunner(layout, cfg.parallel, model.config.attention.sparse.block_size)
