"""Context parallelism: process groups, zigzag sharding, collectives and the CP attention rewiring."""

from lcft.parallel.apply import ContextParallelRunner, apply_context_parallel
from lcft.parallel.config import ParallelConfig
from lcft.parallel.cp_attention import ContextParallelCore
from lcft.parallel.mesh import ParallelState, check_world, init_parallel, single_process_state
from lcft.parallel.sharding import ShardLayout, check_length

__all__ = [
    "ContextParallelCore", "ContextParallelRunner", "ParallelConfig", "ParallelState", "ShardLayout",
    "apply_context_parallel", "check_length", "check_world", "init_parallel", "single_process_state",
]
