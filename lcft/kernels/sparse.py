"""Public API of block-sparse attention: argument checks and dispatch to the reference, cpu and triton kernels."""

from __future__ import annotations

import os
import typing

import torch
import torch.nn.functional as F

from lcft.errors import LcftError
from lcft.kernels.selection_memo import remembered
from lcft.kernels.selectors import get_selector
from lcft.kernels.spec import AttentionImpl, SparseSpec

IMPLS: tuple[str, ...] = typing.get_args(AttentionImpl)


def _resolve_impl(impl: str, device: torch.device) -> str:
    """'auto' -> triton on CUDA, cpu elsewhere; triton on CPU only under the interpreter."""
    if impl not in IMPLS:  # the user's choice was checked where it was read (AttentionConfig): this is a bug
        raise ValueError(f"unknown sparse attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl == "auto":
        return "triton" if device.type == "cuda" else "cpu"
    if impl == "triton" and device.type != "cuda":
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise LcftError("impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the interpreter)")
    return impl


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> None:
    """Raise ValueError on shapes, head counts, dtypes or lengths the kernels do not accept (an internal contract:
    the user's options are checked before any tensor reaches a kernel)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D (batch, heads, length, head_dim)")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head_dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    for name, length in (("query", q.shape[2]), ("key", k.shape[2])):
        if length % block_size:
            raise ValueError(f"{name} length {length} is not a multiple of block_size {block_size}; pad the sequence")


def select_blocks(
    q: torch.Tensor,
    k: torch.Tensor | None,
    spec: SparseSpec,
    *,
    q_block_offset: int = 0,
    k_summary: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block selection by spec.selector: q (B, Hq, Lq, D) -> (B, Hkv, Lq/block, W) int32 global key-block ids.

    Rows are ascending, -1 padded (W = spec.budget for block_mean). q holds query blocks starting at global
    block `q_block_offset`; k holds the keys from position 0 (B, Hkv, Lk, D), or pass `k_summary`, the
    selector's summary of every key block (what context parallelism exchanges). No gradient.
    """
    selector = get_selector(spec.selector)
    block_size = spec.block_size
    if q.dim() != 4 or q.shape[2] % block_size:
        raise ValueError(f"q must be (B, H, L, D) with L a multiple of block_size {block_size}; got {tuple(q.shape)}")
    if k_summary is None:
        if k is None:
            raise ValueError("select_blocks needs k or k_summary")
        if k.shape[2] % block_size:
            raise ValueError(f"key length {k.shape[2]} is not a multiple of block_size {block_size}")
        k_summary = selector.summarise(k, spec)  # (B, Hkv, nK, ...)
    hkv, n_k = k_summary.shape[1], k_summary.shape[2]
    if q.shape[1] % hkv:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({hkv})")
    if q_block_offset < 0 or q_block_offset + q.shape[2] // block_size > n_k:
        raise ValueError(f"query blocks {q_block_offset}..{q_block_offset + q.shape[2] // block_size - 1} "
                         f"reach past the {n_k} key blocks")
    with torch.no_grad():
        return selector.select(q, k_summary, spec, q_block_offset)


def _check_indices(
    indices: torch.Tensor, q: torch.Tensor, k: torch.Tensor, block_size: int, q_block_offset: int
) -> None:
    """Shape always; on CPU also the row contract: own block exactly once, nothing after it, no duplicates."""
    b, hkv = k.shape[0], k.shape[1]
    n_q, n_k = q.shape[2] // block_size, k.shape[2] // block_size
    if indices.dim() != 4 or tuple(indices.shape[:3]) != (b, hkv, n_q):
        raise ValueError(f"indices must be (B, Hkv, nQ, budget) = ({b}, {hkv}, {n_q}, *); got {tuple(indices.shape)}")
    if q_block_offset < 0 or q_block_offset + n_q > n_k:
        raise ValueError(f"query blocks {q_block_offset}..{q_block_offset + n_q - 1} reach past the {n_k} key blocks")
    if indices.device.type == "cuda":
        return  # the checks below synchronise; selection output is valid by construction
    own = torch.arange(q_block_offset, q_block_offset + n_q, device=indices.device)[:, None]  # (nQ, 1)
    idx = indices.long()
    if bool((idx < -1).any()) or bool((idx > own).any()):
        raise ValueError("indices hold a future key block (after the query's own block) or a value below -1")
    if not bool(((idx == own).sum(-1) == 1).all()):
        raise ValueError("each index row must contain its own (diagonal) key block exactly once")
    valid = torch.where(idx < 0, -1 - torch.arange(idx.shape[-1], device=idx.device), idx)  # padding made unique
    if bool((valid.sort(dim=-1).values.diff(dim=-1) == 0).any()):
        raise ValueError("index rows contain a key block twice")


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
    spec: SparseSpec,
    *,
    impl: str = "auto",
    return_indices: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse causal attention over the key blocks spec.selector picks (scale 1/sqrt(D)).

    q (B, Hq, L, D), k, v (B, Hkv, L, D), Hq a multiple of Hkv, L a multiple of spec.block_size.
    Returns out (B, Hq, L, D), and the (B, Hkv, L/block, W) int32 indices if return_indices.
    """
    _check_qkv(q, k, v, spec.block_size)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k lengths differ ({q.shape[2]} vs {k.shape[2]}); use sparse_attention_with_indices")
    resolved = _resolve_impl(impl, q.device)
    # A selector that takes every earlier block when the budget covers them all: dense causal attention is the
    # identical result, and faster.
    covered = getattr(get_selector(spec.selector), "dense_within_budget", False)
    dense = impl == "auto" and covered and q.shape[2] // spec.block_size <= spec.budget
    indices = None
    if return_indices or not dense:
        indices = remembered(lambda: select_blocks(q, k, spec))  # a recompute gets its forward's ids
    if dense:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    else:
        out = sparse_attention_with_indices(q, k, v, indices, block_size=spec.block_size, impl=resolved)
    return (out, indices) if return_indices else out
