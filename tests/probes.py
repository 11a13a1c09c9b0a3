"""Test probes shared across test packages: what the ops of a block of code allocate, and what a reader of a
handed file takes from memory before it refuses it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

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


_PEAK = textwrap.dedent("""
    import importlib, resource, sys
    module, name = sys.argv[1].rsplit(".", 1)
    read = getattr(importlib.import_module(module), name)
    from lcft.errors import LcftError
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        read(sys.argv[2])
    except LcftError as e:
        print("LcftError", e)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, "MiB")
""")


def peak_growth(reader: str, path: str | Path) -> tuple[list[str], int]:
    """(what the reader printed: "LcftError <message>" when it refused, MiB its peak RSS grew) of calling the
    function `reader` ("package.module.function") on `path` in a fresh process, so nothing before counts."""
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _PEAK, reader, str(path)], capture_output=True, text=True,
                          cwd=repo, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    return lines[:-1], int(lines[-1].split()[0])


def read_fp32_model(path: str | Path) -> torch.nn.Module:
    """A model folder read as training reads it (fp32 master weights): a reader for peak_growth that imports no
    more than lcft (a test module importing transformers would raise the peak before it is measured)."""
    from lcft.checkpoint.hf_folder import from_pretrained

    return from_pretrained(path, dtype=torch.float32)
