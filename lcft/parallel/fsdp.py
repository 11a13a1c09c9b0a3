"""FSDP2 for a built model, applied from outside by lcft.parallel.parallelize: `fully_shard` on every decoder block
and on the root module, over the layout mesh's flattened dp x cp dimension (every rank), and the global gradient
norm across the shards.

The cp ranks of one window hold the same weights, so sharding over the whole world (dp x cp flattened, as
torchtitan's dp_shard x cp mesh) spreads parameters, gradients and optimizer state over all ranks. Every
element then lives on exactly one rank: the gradient norm is a sum of local squares reduced over the world.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor


def mixed_precision(bf16: bool) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 master weights and fp32 gradient reduction; plain fp32 otherwise."""
    if not bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def apply_fsdp(root: nn.Module, blocks: Iterable[nn.Module], mesh: DeviceMesh, *, bf16: bool = False,
               offload: bool = False) -> nn.Module:
    """Shard each of `blocks` (one all-gather per block in forward and backward, freed after it) and then
    `root`, which takes the parameters outside the blocks (embeddings, final norm, LM head). `root` must be the
    module whose forward the step calls, so its hooks gather those parameters. In place; returns root.

    bf16: MixedPrecisionPolicy (bf16 compute, fp32 master and reduction). offload: CPUOffloadPolicy (sharded
    parameters, gradients and so optimizer state in CPU memory; the optimizer step runs on the CPU)."""
    policy: OffloadPolicy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    kw = dict(mesh=mesh, mp_policy=mixed_precision(bf16), offload_policy=policy)
    blocks = list(blocks)
    if not blocks:
        raise ValueError("apply_fsdp found no decoder block to shard")
    for i, block in enumerate(blocks):
        # The last block's parameters are gathered again at once by backward: keep them (torchtitan does too).
        fully_shard(block, reshard_after_forward=i < len(blocks) - 1, **kw)
    fully_shard(root, reshard_after_forward=False, **kw)
    return root


def local_grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    """This rank's part of each gradient (the local shard of a DTensor, a plain gradient as it is)."""
    out = []
    for p in params:
        if p.grad is not None:
            g = p.grad
            out.append(g.to_local() if isinstance(g, DTensor) else g)
    return out


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float, sharded: bool) -> float:
    """Clip the gradients to a global L2 norm of `max_norm` (inf: only measure); returns the norm before
    clipping. sharded: the gradients are FSDP shards, each element on one rank, so the squares are summed over
    the world; otherwise every rank holds the whole (already reduced) gradient."""
    grads = local_grads(params)
    dev = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float64, device=dev)
    for g in grads:
        sq += g.detach().double().pow(2).sum()
    if sharded and dist.is_initialized():
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
    norm = float(sq.sqrt())
    if math.isfinite(max_norm) and grads:
        coef = min(1.0, max_norm / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_'s formula
        if coef < 1.0:
            torch._foreach_mul_(grads, coef)
    return norm

