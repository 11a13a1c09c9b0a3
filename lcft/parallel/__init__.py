"""Parallelism applied to a built model from outside: the dp x cp layout and its mesh, context parallelism (zigzag
sharding, collectives, the CP attention rewiring), activation checkpointing, compile and FSDP2 (`parallelize`).

Names resolve lazily (lcft.lazy). `parallelize` is imported from lcft.parallel.parallelize: a lazy name cannot be its
module's (importing the module sets the package's attribute of that name to the module).
"""

from __future__ import annotations

from lcft.lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
