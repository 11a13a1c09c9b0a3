"""Test probes shared across test packages: what the ops of a block of code allocate."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns (optionally only tensors `keep` accepts).
    A dispatch mode sees every aten op, in forward, backward and inside custom autograd Functions."""

    def __init__(self, keep: Callable[[torch.Tensor], bool] | None = None) -> None:
        super().__init__()
        self.keep = keep
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (self.keep is None or self.keep(t)):
                self.numel = max(self.numel, t.numel())
        return out
