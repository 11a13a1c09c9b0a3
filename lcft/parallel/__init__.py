"""Context parallelism: process groups, zigzag sharding, collectives and the CP attention rewiring."""
