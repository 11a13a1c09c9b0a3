"""Parallelism applied to a built model from outside: the dp x cp layout and its mesh, context parallelism (zigzag
sharding, collectives, the CP attention rewiring), activation checkpointing, compile and FSDP2 (`parallelize`).

Names are resolved lazily so that importing one module of the package (its config, say) does not import
torch and the rest of it. `parallelize` is imported from lcft.parallel.parallelize: a lazy name cannot be its
module's (importing the module sets the package's attribute of that name to the module).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ContextParallelRunner": "lcft.parallel.apply",
    "apply_context_parallel": "lcft.parallel.apply",
    "ParallelConfig": "lcft.parallel.config",
    "ContextParallelCore": "lcft.parallel.cp_attention",
    "ParallelState": "lcft.parallel.mesh",
    "check_world": "lcft.parallel.mesh",
    "init_parallel": "lcft.parallel.mesh",
    "single_process_state": "lcft.parallel.mesh",
    "ParallelizeConfig": "lcft.parallel.parallelize",
    "ShardLayout": "lcft.parallel.sharding",
    "check_length": "lcft.parallel.sharding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lcft.parallel' has no attribute {name!r}")
