"""Key-block selections of a checkpointed region kept for its recompute, so backward attends over exactly the
blocks the forward chose and the selector (with, under context parallelism, its summary exchange) runs once.

A region (one block under activation checkpointing, lcft.parallel.activations) runs its forward inside
`memo.run()`, and every selection inside it goes through `remembered`: the first run records each selection in
call order, every later run (the recompute in backward) gets them back in the same order without selecting.
Outside a region `remembered` just selects. The kept ids are small: (B, Hkv, L/block, W) int32 per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch


class SelectionMemo:
    """The selections of one checkpointed region, in call order: recorded by its first run, replayed by each
    later one."""

    def __init__(self) -> None:
        self._saved: list[torch.Tensor] = []
        self._runs = 0
        self._replaying = False
        self._next = 0

    @contextmanager
    def run(self) -> Iterator[None]:
        """One run of the region: the first records, each later one replays from its first selection. Entered
        inside the region's function, so it holds in whatever thread autograd recomputes in."""
        self._replaying, self._next = self._runs > 0, 0
        self._runs += 1
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def take(self, select: Callable[[], torch.Tensor]) -> torch.Tensor:
        """select() on the first run (kept), the kept selection of the same call on a later run."""
        if not self._replaying:
            ids = select()
            self._saved.append(ids)
            return ids
        if self._next >= len(self._saved):  # the region's code path changed between its runs: a bug
            raise RuntimeError(f"recompute asks for selection {self._next + 1}; its forward made {len(self._saved)}")
        ids = self._saved[self._next]
        self._next += 1
        return ids


_ACTIVE: ContextVar[SelectionMemo | None] = ContextVar("lcft_selection_memo", default=None)


def remembered(select: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The key-block ids `select()` returns, or, in a region's recompute, the ids its forward's same call got."""
    memo = _ACTIVE.get()
    return select() if memo is None else memo.take(select)
