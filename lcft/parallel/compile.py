"""`--compile`: regional torch.compile of every decoder block's token-wise work, applied from outside the model.

Compiled per block: the attention norm, the fused q/k/v projection with RoPE (`attn.qkv`), the output
projection (`attn.out_proj`), the MLP norm and the MLP. The attention core stays eager, so whatever core a block
holds (dense SDPA, the sparse kernels, the context-parallel core with its collectives) runs as it is, and the
compiled regions are the same whether a block runs whole or seq_chunk tokens at a time (`Block.qkv` and
`Block.tail`, which lcft.parallel.activations runs per chunk, call these same pieces). Parameters, their names
and checkpoints do not change. Activation checkpointing recomputes through the compiled regions; FSDP2's
per-block hooks sit around them.

Every block runs the same code on same-shaped weights, so one graph per region serves all blocks (nn.Module
inlining makes parameters graph inputs instead of guarded constants); `dynamic=False` keeps the graphs static:
the sequence (or chunk) length and the last, shorter chunk each compile once.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lcft.errors import LcftError

REGIONS = ("attn_norm", "attn.qkv", "attn.out_proj", "mlp_norm", "mlp")
"""What compile_blocks compiles in each block, by path: a submodule (its compiled call) or a method."""


def check_compiler(device: torch.device) -> None:
    """Inductor on CPU builds C++: refuse with a one-line message before any work when no compiler exists."""
    if device.type == "cpu" and sys.platform != "win32" and not (shutil.which("g++") or shutil.which("c++")
                                                                 or shutil.which("clang++")):
        raise LcftError("--compile on CPU needs a C++ compiler (g++ or clang++) on PATH, e.g. "
                        "`apt-get install g++`; or train without --compile")


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False)


def compile_blocks(model: nn.Module, device: torch.device) -> int:
    """Compile the token-wise regions of every block of an lcft Llama in place for `device`; returns the number
    of blocks. lcft.parallel.parallelize applies it after the context-parallel core swap and activation
    checkpointing, before FSDP."""
    check_compiler(device)
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError("compile_blocks needs an lcft Llama model (with .layers)")  # the CLI builds only those
    # Blocks share one graph per region; allow a graph per region per distinct length without falling back.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    for block in layers:
        for path in REGIONS:
            owner_path, _, name = path.rpartition(".")
            owner = block.get_submodule(owner_path)
            region = getattr(owner, name)
            if isinstance(region, nn.Module):
                region.compile(dynamic=False)
            else:  # an instance attribute over the method: the class's (and other models') stay eager
                setattr(owner, name, _compiled(region))
    return len(layers)
