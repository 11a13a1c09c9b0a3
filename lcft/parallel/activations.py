"""Activation checkpointing, activation offload to CPU and sequence chunks for the blocks of a built model, applied
from outside (as torchtitan's apply_ac): the model keeps only its math, each block's forward is rerouted here.

'block' keeps only each block's input and recomputes the block in backward (non-reentrant
torch.utils.checkpoint). offload keeps what is saved in CPU memory: with 'block' the block inputs (a host copy
taken in forward, brought back for the recompute; offload_dtype bf16 keeps it in bf16), with 'none' every
activation a block saves (torch.autograd.graph.save_on_cpu). seq_chunk (with 'block'; 0 = off) runs each block's token-wise work (norms,
projections, RoPE, MLP) that many tokens at a time, each chunk under its own nested checkpoint, so a block's
transients in forward and in the backward recompute are chunk-sized instead of sequence-sized; only the attention
core sees the whole sequence (also without grad). Same numbers as the plain model, but for the recompute of a bf16
host copy: the forward and the gradient's path are the plain block's, the backward is taken at the input rounded
to bf16 (what its matmuls see after the norm under autocast anyway). The recompute of a block
reuses the key blocks its forward selected (lcft.kernels.selection_memo): the selector runs once per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, get_args

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lcft.kernels.selection_memo import SelectionMemo
from lcft.parallel.config import Checkpointing

# Tokens per chunk of a block's token-wise work under block checkpointing: the tiny preset's chunk transients
# are then ~50 MiB (fp32) whatever the sequence length. Measured on the tiny shape at 16K tokens, fp32: peak RSS
# 1.55 GiB with 16K chunks, 1.22 GiB with 4K, 1.16 GiB with 2K, at the same step time (20.5, 20.1, 21.3 s).
DEFAULT_SEQ_CHUNK = 4096

BlockOut = tuple[torch.Tensor, torch.Tensor | None]  # (output (B, L, H), MoE router statistics (2, E) or None)


def apply_activation_checkpointing(model: nn.Module, mode: Checkpointing = "block", offload: bool = False,
                                   seq_chunk: int = DEFAULT_SEQ_CHUNK, offload_dtype: torch.dtype | None = None
                                   ) -> nn.Module:
    """Route every block of an lcft Llama through `mode` / `offload` / `seq_chunk` (see the module docstring);
    in place, returns the model. `offload_dtype`: with 'block' and offload, the dtype of the host copies (None =
    the block input's own). Applying it again replaces the settings; ('none', no offload) restores the plain
    blocks. The settings are recorded on the model as `checkpointing`, `offload`, `seq_chunk`, `offload_dtype`.
    Apply it before compile and FSDP (lcft.parallel.parallelize): their hooks then sit around the rerouted
    forward."""
    if isinstance(seq_chunk, bool) or not isinstance(seq_chunk, int) or seq_chunk < 0:  # no option sets it: a bug
        raise ValueError(f"seq_chunk must be a non-negative integer, got {seq_chunk!r}")
    if mode not in get_args(Checkpointing):  # the config checked the user's choice: anything else is a bug
        raise ValueError(f"checkpointing mode must be one of {get_args(Checkpointing)}, got {mode!r}")
    n = seq_chunk if mode == "block" else 0
    stash = offload_dtype if mode == "block" and offload else None
    for block in model.layers:
        block.__dict__.pop("forward", None)  # the class's forward again (a previous call's routing undone)
        if mode == "block" or offload:
            block.forward = functools.partial(_forward, block, type(block).forward, mode, bool(offload), n, stash)
    model.checkpointing, model.offload, model.seq_chunk, model.offload_dtype = mode, bool(offload), n, stash
    return model


def _forward(block: nn.Module, plain: Callable[..., BlockOut], mode: Checkpointing, offload: bool, n: int,
             stash: torch.dtype | None, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> BlockOut:
    """One block's forward under the settings: x (B, L, H), cos/sin (B or 1, 1, L, D/2)."""
    if not torch.is_grad_enabled():
        return _chunked(block, plain, x, cos, sin, n)
    if mode == "block":
        memo = SelectionMemo()  # the recompute attends over the blocks this forward selects, selecting nothing
        if offload:
            return _offloaded(memo, block, plain, x, cos, sin, n, stash or x.dtype)
        return checkpoint(_remembering, memo, block, plain, x, cos, sin, n, use_reentrant=False)
    with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
        return plain(block, x, cos, sin)


def _offloaded(memo: SelectionMemo, block: nn.Module, plain: Callable[..., BlockOut], x: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, n: int, dtype: torch.dtype) -> BlockOut:
    """A block checkpoint whose saved input is a host copy in `dtype`. The forward runs on x itself, so its output
    and the gradient's path back to x (x's own dtype, not the copy's) are the plain block's; x is not an input
    of the checkpoint, which would keep it alive on the device until backward. Only the recompute reads the
    copy, brought back to x's device and dtype and marked as x is (requiring grad or not): the recompute must record
    the ops the forward did, its saved values then replace the forward's, as for any non-reentrant checkpoint
    (a compiled region traces again for an input that requires no grad, and saves one value fewer)."""
    device, like, grad = x.device, x.dtype, x.requires_grad
    # Rounded on the device, then copied: a copy that also converts would stage the whole fp32 input on the host.
    host = x.detach().to(dtype).to("cpu")  # (B, L, H); on CPU in its own dtype, the input itself
    given = [x]  # the forward's input, handed over once; the closure must not hold x

    def run(c: torch.Tensor, s: torch.Tensor) -> BlockOut:
        # (B, L, H), converted on the device after the copy; the bf16 one there is freed before the recompute's
        # saved values exist
        xin = given.pop() if given else host.to(device, non_blocking=True).to(like).detach().requires_grad_(grad)
        return _remembering(memo, block, plain, xin, c, s, n)

    del x
    return checkpoint(run, cos, sin, use_reentrant=False)


def _remembering(memo: SelectionMemo, block: nn.Module, plain: Callable[..., BlockOut], x: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, n: int) -> BlockOut:
    """_chunked as one run of the checkpointed region `memo` keeps the key-block selections of."""
    with memo.run():
        return _chunked(block, plain, x, cos, sin, n)


def _chunked(block: nn.Module, plain: Callable[..., BlockOut], x: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, n: int) -> BlockOut:
    """The block's output with its token-wise work n tokens at a time (the plain forward when n == 0 or the
    sequence fits one chunk): Block.qkv and Block.tail per chunk, the attention core over the whole sequence."""
    if n <= 0 or x.shape[1] <= n:
        return plain(block, x, cos, sin)
    xs = x.split(n, dim=1)  # (B, C, H) each; split, not narrow: one backward node, no full-size zeros
    cs, ss = cos.split(n, dim=2), sin.split(n, dim=2)  # (B or 1, 1, C, D/2) each
    qkv = [_per_chunk(block.qkv, xc, c, s) for xc, c, s in zip(xs, cs, ss, strict=True)]
    q, k, v = (torch.cat(parts, dim=2) for parts in zip(*qkv, strict=True))  # (B, Hq or Hkv, L, D)
    del qkv
    out = block.attn.core(q, k, v)  # (B, Hq, L, D)
    del q, k, v
    outs = out.split(n, dim=2)  # (B, Hq, C, D) each
    parts = [_per_chunk(block.tail, xc, oc) for xc, oc in zip(xs, outs, strict=True)]
    stats = torch.stack([p[1] for p in parts]).sum(0) if block.router_stats else None  # (2, E)
    return torch.cat([p[0] for p in parts], dim=1), stats  # (B, L, H)


def _per_chunk(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    """fn(*args), under a non-reentrant checkpoint when grad is on: keeps only the (chunk-sized) inputs and
    recomputes the chunk in backward (nests inside the block checkpoint)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False)
