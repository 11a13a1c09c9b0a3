"""Parallelism applied to a built model from outside: the dp x cp layout and its mesh, context parallelism (zigzag
sharding, collectives, the CP attention rewiring), activation checkpointing, compile and FSDP2 (`parallelize`)."""

from lcft.parallel.apply import ContextParallelRunner, apply_context_parallel
from lcft.parallel.config import ParallelConfig
from lcft.parallel.cp_attention import ContextParallelCore
from lcft.parallel.mesh import ParallelState, check_world, init_parallel, single_process_state
from lcft.parallel.parallelize import ParallelizeConfig, parallelize
from lcft.parallel.sharding import ShardLayout, check_length

__all__ = [
    "ContextParallelCore", "ContextParallelRunner", "ParallelConfig", "ParallelState", "ParallelizeConfig",
    "ShardLayout", "apply_context_parallel", "check_length", "check_world", "init_parallel", "parallelize",
    "single_process_state",
]
