"""Where each figure of `lcft plan` comes from: the formula, or the measured or assumed constant (--explain)."""

from __future__ import annotations

from lcft.plan.estimate import (
    CPU_FSDP_HEAP_COPIES,
    CPU_PROCESS_GROUP,
    CPU_RUNTIME,
    CPU_SPARSE_KERNEL,
    CPU_THREAD_SHARE,
    CUDA_MARGIN,
    CUDA_NCCL,
    CUDA_RUNTIME,
    GIB,
    GLIBC_MMAP_CEILING,
    HOST_PROCESS,
    LONG_WINDOW,
    Layout,
    casts_weights,
    compute_bytes,
    cpu_kernel_bytes,
    load_bytes,
    long_share,
    moves_to_host,
    residual_bytes,
)
from lcft.plan.shape import Shape


def sources(shape: Shape, lay: Layout) -> dict[str, str]:
    """Where each figure of `estimate` comes from, one or more lines per term (`lcft plan --explain`)."""
    a = compute_bytes(lay.precision)
    per = f"⌈P/{lay.world}⌉" if lay.shard == "fsdp" else "P"
    out = {"parameters": f"formula: 4 B x {per}, P = {shape.params:,} (fp32 master weights)",
           "gradients": f"formula: 4 B x {per} (fp32)" + (" + 4 B x P (DDP's buckets)" if lay.shard == "none"
                                                           and lay.world > 1 else ""),
           "optimizer": f"formula: 8 B x {per} (AdamW's two fp32 moments)",
           "weight_copies": _weight_copies(shape, lay, a),
           "kv": "formula: remote K/V and their gradients (docs/plan.md)" if lay.cp > 1 else "formula: 0 (cp 1)"}
    out["activations"] = _activations(shape, lay, a)
    out["transient"] = ("formula: " + ("the recomputed block and its gradients" if lay.checkpointing == "block"
                                       else "the gradients of one block's saved values")
                        + ", the hidden state's fp32 gradient, three fp32 logit chunks of the loss")
    if lay.device == "cpu":
        out["runtime"] = (f"measured constants (benchmarks/plan.py): {CPU_RUNTIME >> 20} MiB per process"
                          + (f" + {CPU_PROCESS_GROUP >> 20} MiB per rank of a multi-process run" if lay.world > 1
                             else "")
                          + (f" + {cpu_kernel_bytes(shape, lay) >> 20} MiB chunked attention kernel (its chunk "
                             f"buffers, at least {CPU_SPARSE_KERNEL >> 20} MiB)" if cpu_kernel_bytes(shape, lay)
                             else "")
                          + (f" + {CPU_THREAD_SHARE} x the block transient x {lay.threads - 1} threads beyond "
                             "the first" if lay.threads > 1 and lay.seq_len < LONG_WINDOW else ""))
        if lay.seq_len >= LONG_WINDOW:
            share = f"{long_share(lay):.2f}"
            out["transient"] += (f"\nmeasured factor: x {share} on CPU from {LONG_WINDOW:,} tokens "
                                 f"{'under cp ' if lay.cp > 1 else ''}(freed buffers go back to the OS at once)")
            out["kv"] += f"\nmeasured factor: x {share} on CPU from {LONG_WINDOW:,} tokens"
        else:
            if lay.cp > 1:
                out["kv"] += (f"\nmeasured: x 2 on CPU below {LONG_WINDOW:,} tokens (fitted to a later step's "
                              "peak; glibc keeps freed buffers in its heap)")
            again = ("the recompute" if lay.checkpointing == "block" else
                     f"one block's gradient buffers under glibc's {GLIBC_MMAP_CEILING >> 20} MiB mmap ceiling")
            out["transient"] += (f"\nmeasured: + the gradients and {again} a second time on CPU below "
                                 f"{LONG_WINDOW:,} tokens (glibc keeps freed buffers in its heap), + 4 B x {per} "
                                 "fitted to a later step's peak"
                                 + (f"; fsdp: {CPU_FSDP_HEAP_COPIES} unsharded fp32 copies of the model"
                                    if lay.shard == "fsdp" else ""))
        out["margin"] = "none on CPU: the constants above are measured"
    else:
        out["runtime"] = (f"assumed (not measurable without a GPU): {CUDA_RUNTIME / GIB:.2f} GiB CUDA context, "
                          "kernel images, cuBLAS/Triton workspaces"
                          + (f" + {CUDA_NCCL >> 20} MiB NCCL buffers" if lay.world > 1 else ""))
        out["margin"] = (f"assumed safety margin: {CUDA_MARGIN:.0%} of activations, K/V and transient (the caching "
                         "allocator's rounding and fragmentation)")
        out["host"] = (f"assumed (not measurable without a GPU): {HOST_PROCESS / GIB:.2f} GiB per process beside what "
                       "it offloads (the interpreter, torch and the CUDA libraries, the data windows, checkpoint "
                       "staging)\nformula: + the larger of what it offloads and the weights it reads at start ("
                       + ("0: fsdp reads the sharded checkpoint shard by shard)" if not load_bytes(shape, lay)
                          else "4 B x P: the whole model in fp32 before it leaves the CPU)"))
    return out


def _activations(shape: Shape, lay: Layout, a: int) -> str:
    """The source of the activations held: block inputs (where they are, in what) or every saved value."""
    r, tokens = residual_bytes(lay), f"{lay.micro_batch * lay.local_tokens:,} tokens"
    stream = f"the residual stream at {r} B" + (" (fp32 under autocast)" if r != a else "")
    if lay.checkpointing != "block":
        return (f"formula: {tokens} x (N·S = {shape.layers * shape.saved_per_token:,} values saved per token at {a} "
                f"B, 2N·H of them and 3H more {stream}; RoPE fp32)")
    moved = " offloaded" if lay.offload_activations and moves_to_host(lay) else ""
    in_bf16 = " (in bf16)" if lay.bf16_copies else ""
    return (f"formula: {tokens} x (N·H block inputs{moved}{in_bf16} + 3H, {stream}; RoPE fp32)"
            + (f" + N x the key-block ids the recompute reuses (int32, {shape.budget} per KV head and block)"
               if shape.sparse else ""))


def _weight_copies(shape: Shape, lay: Layout, a: int) -> str:
    """The source of the weight working copies: what each block copies, how many blocks hold theirs, fsdp's."""
    what = "fused qkv" + ("" if shape.experts else " + gate|up")
    if casts_weights(lay):
        what += " + the autocast copies of o_proj and " + ("every expert and the router" if shape.experts else "down")
    held = 1 if lay.checkpointing == "block" else shape.layers
    return (f"formula: {what} of {held} block(s) at {a} B"
            + (" + 2 all-gathered blocks and the root (fsdp)" if lay.shard == "fsdp" else ""))
