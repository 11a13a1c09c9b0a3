"""Autograd-aware collectives for context parallelism (all_gather, all_to_all) and the sum all-reduce the trainer's
loss normaliser takes, with byte counts.

Only collectives are used (no point-to-point batch_isend_irecv, which can hang on gloo).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

# Newer torch renames the *_tensor collectives *_single; use whichever exists (no deprecation warnings).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CommStats:
    """Bytes this rank sent, per tag ('kv', 'kv_grad', 'summary', ...), since the last reset."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds = 0.0
        """Wall time inside collectives (transfer plus waiting for slower ranks): step time minus this is
        the rank's own compute, which is what load balance is about."""
        self.synchronize = False
        """Time a CUDA collective to its end: NCCL returns once the op is queued, so without a device synchronize
        around it `seconds` stays near 0 and the wait shows as compute (benchmarks only: it removes overlap)."""

    def add(self, tag: str, nbytes: int) -> None:
        self.bytes[tag] += int(nbytes)
        self.calls[tag] += 1

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()
        self.seconds = 0.0

    @contextmanager
    def timed(self) -> Iterator[None]:
        sync = torch.cuda.synchronize if self.synchronize and torch.cuda.is_available() else (lambda: None)
        sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.seconds += time.perf_counter() - t0

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def snapshot(self) -> dict[str, int]:
        return dict(self.bytes)


STATS = CommStats()
"""Process-wide byte counter (the benchmark reads and resets it around a step)."""


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def all_gather_nograd(x: torch.Tensor, group: dist.ProcessGroup | None, tag: str = "gather") -> torch.Tensor:
    """(n, *x.shape): every rank's `x` stacked in group-rank order; no gradient."""
    n = group_size(group)
    out = _gather(x.detach(), n, group)  # (n, ...)
    STATS.add(tag, _nbytes(x) * (n - 1))
    return out


def _gather(x: torch.Tensor, n: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    # The *_single collectives concatenate along dim 0 (gloo insists on that shape); a 0-d or leading
    # dim is added by viewing x as (1, ...).
    x = x.contiguous().reshape(1, *x.shape)
    out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)  # (n, ...)
    with STATS.timed():
        _all_gather_single(out, x, group=group)
    return out


def _reduce_scatter(grad: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum over ranks of grad[i] delivered to rank i: (n, *shape) -> (*shape)."""
    out = torch.empty((1, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)  # dim 0 split n ways
    try:
        with STATS.timed():
            _reduce_scatter_single(out, grad.contiguous(), group=group)
        out = out[0]
    except RuntimeError as e:  # older gloo builds lack reduce_scatter: same traffic via all_to_all + sum
        if "not supported" not in str(e).lower() and "unsupported" not in str(e).lower():
            raise
        recv = torch.empty_like(grad)  # (n, ...): piece i came from rank i
        with STATS.timed():
            dist.all_to_all_single(recv, grad.contiguous(), group=group)
        out = recv.sum(0)
    return out


class _GatherOwnLast(torch.autograd.Function):
    """Forward: every rank's piece concatenated along `dim`, the other ranks' in order (me+1, ..., me-1)
    and this rank's own piece LAST, so local queries sit after every remote key. Backward: the gradient of
    each piece goes back to its owner, summed over ranks (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None, dim: int, tag: str) -> torch.Tensor:
        n, me = group_size(group), dist.get_rank(group)
        ctx.group, ctx.dim, ctx.tag, ctx.n, ctx.me = group, dim, tag, n, me
        gathered = _gather(x, n, group)  # (n, ...) in rank order
        STATS.add(tag, _nbytes(x) * (n - 1))
        order = [(me + 1 + i) % n for i in range(n)]  # own rank last
        return torch.cat([gathered[r] for r in order], dim=dim)  # the gather buffer is freed on return

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # grad: the concatenation's shape
        n, me, dim = ctx.n, ctx.me, ctx.dim
        piece = grad.shape[dim] // n
        pos = {(me + 1 + i) % n: i for i in range(n)}  # rank -> its position in the concatenation
        send = torch.stack([grad.narrow(dim, pos[r] * piece, piece) for r in range(n)])  # (n, ...) rank order
        out = _reduce_scatter(send, ctx.group)
        STATS.add(ctx.tag + "_grad", _nbytes(send) * (n - 1) // n)
        return out, None, None, None


def gather_own_last(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int, tag: str = "gather"
                    ) -> torch.Tensor:
    """Differentiable all-gather along `dim` with this rank's piece last (see _GatherOwnLast)."""
    return _GatherOwnLast.apply(x, group, dim, tag)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 with split sizes; backward is the same exchange in reverse."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup | None, tag: str) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.tag = (out_splits, in_splits), group, tag
        out = torch.empty((sum(out_splits), *x.shape[1:]), dtype=x.dtype, device=x.device)  # (N_out, ...)
        with STATS.timed():
            dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_splits,
                                   input_split_sizes=in_splits, group=group)
        STATS.add(tag, _sent_rows(in_splits, group) * _row_bytes(x))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # grad (N_out, ...)
        out_splits, in_splits = ctx.splits
        back = torch.empty((sum(in_splits), *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        with STATS.timed():
            dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=in_splits,
                                   input_split_sizes=out_splits, group=ctx.group)
        STATS.add(ctx.tag + "_grad", _sent_rows(out_splits, ctx.group) * _row_bytes(grad))
        return back, None, None, None, None


def _row_bytes(x: torch.Tensor) -> int:
    return (x.numel() // max(x.shape[0], 1)) * x.element_size() if x.shape[0] else 0


def _sent_rows(splits: Sequence[int], group: dist.ProcessGroup | None) -> int:
    me = dist.get_rank(group)
    return sum(s for i, s in enumerate(splits) if i != me)


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
               group: dist.ProcessGroup | None, tag: str = "a2a") -> torch.Tensor:
    """Differentiable all_to_all_single over dim 0: rows x[sum(in_splits[:j]):...] go to rank j."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group, tag)


def all_to_all_nograd(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                      group: dist.ProcessGroup | None, tag: str = "a2a") -> torch.Tensor:
    """all_to_all_single without autograd (index exchanges)."""
    out = torch.empty((sum(out_splits), *x.shape[1:]), dtype=x.dtype, device=x.device)
    with STATS.timed():
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(out_splits),
                               input_split_sizes=list(in_splits), group=group)
    STATS.add(tag, _sent_rows(in_splits, group) * _row_bytes(x))
    return out


def all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup | None, tag: str = "reduce") -> torch.Tensor:
    """Sum of `x` over the group (None: the world), as a new tensor with no gradient (counts, reported losses)."""
    out = x.detach().clone()
    if dist.is_available() and dist.is_initialized() and group_size(group) > 1:
        with STATS.timed():
            dist.all_reduce(out, group=group)
        STATS.add(tag, _nbytes(out))
    return out


def all_reduce_max(x: torch.Tensor, group: dist.ProcessGroup | None, tag: str = "max") -> torch.Tensor:
    """Elementwise max of `x` over the group (None: the world), as a new tensor with no gradient (peak memory, the
    signal the ranks agree on)."""
    out = x.detach().clone()
    if dist.is_available() and dist.is_initialized() and group_size(group) > 1:
        with STATS.timed():
            dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
        STATS.add(tag, _nbytes(out))
    return out

