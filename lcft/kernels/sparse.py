"""Public API of block-sparse attention: argument checks and dispatch to the reference, cpu and triton kernels."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lcft.errors import LcftError
from lcft.kernels.selection import budget_of, check_selection_args, select_blocks_torch

IMPLS = ("auto", "reference", "cpu", "triton")


@dataclass
class SparseAttentionConfig:
    """Settings of block-sparse attention (DESIGN.md §4); `kwargs()` feeds `sparse_attention`."""

    block_size: int = 64
    """Tokens per block: the unit of selection and of the attention kernels (64 on CPU, 128 on GPU)."""
    top_k: int = 16
    """Best-scoring earlier key blocks each query block attends to, besides its own, local and sink blocks."""
    local_blocks: int = 1
    """Key blocks immediately before each query block that are always attended."""
    sink_blocks: int = 1
    """First key blocks of the sequence that are always attended (attention sinks)."""
    impl: str = "auto"
    """Kernel: auto (triton on CUDA, cpu otherwise, dense SDPA when the budget covers all blocks),
    reference (plain PyTorch with an explicit mask; small shapes only), cpu (chunked PyTorch), triton."""

    @property
    def budget(self) -> int:
        """Key blocks attended per query block: top_k + local_blocks + sink_blocks + 1."""
        return budget_of(self.top_k, self.local_blocks, self.sink_blocks)

    def kwargs(self) -> dict:
        """Keyword arguments of `sparse_attention`."""
        return {"block_size": self.block_size, "top_k": self.top_k, "local_blocks": self.local_blocks,
                "sink_blocks": self.sink_blocks, "impl": self.impl}


def _resolve_impl(impl: str, device: torch.device) -> str:
    """'auto' -> triton on CUDA, cpu elsewhere; triton on CPU only under the interpreter."""
    if impl not in IMPLS:
        raise LcftError(f"unknown sparse attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl == "auto":
        return "triton" if device.type == "cuda" else "cpu"
    if impl == "triton" and device.type != "cuda":
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise LcftError("impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the interpreter)")
    return impl


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> None:
    """Raise LcftError on shapes, head counts, dtypes or lengths the kernels do not accept."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise LcftError("q, k, v must be 4-D (batch, heads, length, head_dim)")
    if k.shape != v.shape:
        raise LcftError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise LcftError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head_dim")
    if q.shape[1] % k.shape[1]:
        raise LcftError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype):
        raise LcftError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    for name, length in (("query", q.shape[2]), ("key", k.shape[2])):
        if length % block_size:
            raise LcftError(f"{name} length {length} is not a multiple of block_size {block_size}; pad the sequence")


def select_blocks(
    q: torch.Tensor,
    k: torch.Tensor | None,
    *,
    block_size: int,
    top_k: int,
    local_blocks: int,
    sink_blocks: int,
    q_block_offset: int = 0,
    k_summary: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k block selection: q (B, Hq, Lq, D) -> (B, Hkv, Lq/block, budget) int32 global key-block ids.

    Rows are ascending, -1 padded. q holds query blocks starting at global block `q_block_offset`; k holds the
    keys from position 0 (B, Hkv, Lk, D), or pass `k_summary` (B, Hkv, nK, D), the mean of each key block.
    Runs the Triton selection kernel on CUDA, chunked PyTorch elsewhere. No gradient.
    """
    check_selection_args(block_size, top_k, local_blocks, sink_blocks)
    impl = "triton" if q.device.type == "cuda" else "cpu"
    return _select(q, k, block_size=block_size, top_k=top_k, local_blocks=local_blocks, sink_blocks=sink_blocks,
                   q_block_offset=q_block_offset, k_summary=k_summary, impl=impl)


def _select(
    q: torch.Tensor, k: torch.Tensor | None, *, block_size: int, top_k: int, local_blocks: int, sink_blocks: int,
    q_block_offset: int, k_summary: torch.Tensor | None, impl: str,
) -> torch.Tensor:
    """Checked selection with the chosen implementation (triton or chunked PyTorch)."""
    if q.dim() != 4 or q.shape[2] % block_size:
        raise LcftError(f"q must be (B, H, L, D) with L a multiple of block_size {block_size}; got {tuple(q.shape)}")
    if k_summary is None:
        if k is None:
            raise LcftError("select_blocks needs k or k_summary")
        if k.shape[2] % block_size:
            raise LcftError(f"key length {k.shape[2]} is not a multiple of block_size {block_size}")
        hkv, n_k = k.shape[1], k.shape[2] // block_size
    else:
        hkv, n_k = k_summary.shape[1], k_summary.shape[2]
    if q.shape[1] % hkv:
        raise LcftError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({hkv})")
    if q_block_offset < 0 or q_block_offset + q.shape[2] // block_size > n_k:
        raise LcftError(f"query blocks {q_block_offset}..{q_block_offset + q.shape[2] // block_size - 1} "
                        f"reach past the {n_k} key blocks")
    kw = dict(block_size=block_size, top_k=top_k, local_blocks=local_blocks, sink_blocks=sink_blocks,
              q_block_offset=q_block_offset, k_summary=k_summary)
    if impl == "triton":
        from lcft.kernels.selection_triton import select_blocks_triton

        return select_blocks_triton(q, k, **kw)
    return select_blocks_torch(q, k, **kw)


def _check_indices(
    indices: torch.Tensor, q: torch.Tensor, k: torch.Tensor, block_size: int, q_block_offset: int
) -> None:
    """Shape always; on CPU also the row contract: own block exactly once, nothing after it, no duplicates."""
    b, hkv = k.shape[0], k.shape[1]
    n_q, n_k = q.shape[2] // block_size, k.shape[2] // block_size
    if indices.dim() != 4 or tuple(indices.shape[:3]) != (b, hkv, n_q):
        raise LcftError(f"indices must be (B, Hkv, nQ, budget) = ({b}, {hkv}, {n_q}, *); got {tuple(indices.shape)}")
    if q_block_offset < 0 or q_block_offset + n_q > n_k:
        raise LcftError(f"query blocks {q_block_offset}..{q_block_offset + n_q - 1} reach past the {n_k} key blocks")
    if indices.device.type == "cuda":
        return  # the checks below synchronise; selection output is valid by construction
    own = torch.arange(q_block_offset, q_block_offset + n_q, device=indices.device)[:, None]  # (nQ, 1)
    idx = indices.long()
    if bool((idx < -1).any()) or bool((idx > own).any()):
        raise LcftError("indices hold a future key block (after the query's own block) or a value below -1")
    if not bool(((idx == own).sum(-1) == 1).all()):
        raise LcftError("each index row must contain its own (diagonal) key block exactly once")
    valid = torch.where(idx < 0, -1 - torch.arange(idx.shape[-1], device=idx.device), idx)  # padding made unique
    if bool((valid.sort(dim=-1).values.diff(dim=-1) == 0).any()):
        raise LcftError("index rows contain a key block twice")


def sparse_attention_with_indices(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    *,
    block_size: int,
    q_block_offset: int = 0,
    impl: str = "auto",
) -> torch.Tensor:
    """Causal attention of q over the chosen key blocks of k, v; gradients flow to q, k and v.

    q (B, Hq, Lq, D); k, v (B, Hkv, Lk, D) hold the global sequence from position 0; query token i sits at global
    position q_block_offset·block_size + i; indices (B, Hkv, Lq/block, budget) from `select_blocks`.
    """
    _check_qkv(q, k, v, block_size)
    _check_indices(indices, q, k, block_size, q_block_offset)
    impl = _resolve_impl(impl, q.device)
    if impl == "reference":
        from lcft.kernels.sparse_reference import sparse_attention_reference

        return sparse_attention_reference(q, k, v, indices, block_size=block_size, q_block_offset=q_block_offset)
    if impl == "triton":
        from lcft.kernels.sparse_triton import sparse_attention_triton

        return sparse_attention_triton(q, k, v, indices, block_size=block_size, q_block_offset=q_block_offset)
    from lcft.kernels.sparse_cpu import sparse_attention_cpu

    return sparse_attention_cpu(q, k, v, indices, block_size=block_size, q_block_offset=q_block_offset)


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int = 64,
    top_k: int = 16,
    local_blocks: int = 1,
    sink_blocks: int = 1,
    impl: str = "auto",
    return_indices: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse causal attention with top-k block selection (scale 1/sqrt(D)).

    q (B, Hq, L, D), k, v (B, Hkv, L, D), Hq a multiple of Hkv, L a multiple of block_size.
    Returns out (B, Hq, L, D), and the (B, Hkv, L/block, budget) int32 indices if return_indices.
    """
    check_selection_args(block_size, top_k, local_blocks, sink_blocks)
    _check_qkv(q, k, v, block_size)
    if q.shape[2] != k.shape[2]:
        raise LcftError(f"q and k lengths differ ({q.shape[2]} vs {k.shape[2]}); use sparse_attention_with_indices")
    resolved = _resolve_impl(impl, q.device)
    n_blocks = q.shape[2] // block_size
    dense = impl == "auto" and n_blocks <= budget_of(top_k, local_blocks, sink_blocks)
    indices = None
    if return_indices or not dense:
        indices = _select(q, k, block_size=block_size, top_k=top_k, local_blocks=local_blocks,
                          sink_blocks=sink_blocks, q_block_offset=0, k_summary=None, impl=resolved)
    if dense:
        # Every earlier block is chosen anyway: dense causal attention is the identical result, and faster.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    else:
        out = sparse_attention_with_indices(q, k, v, indices, block_size=block_size, impl=resolved)
    return (out, indices) if return_indices else out
