"""The trainer's reductions over gloo ranks go through lcft.parallel.comms, which counts them (comms.STATS)."""

from __future__ import annotations

import torch

from lcft.parallel import comms
from tests.parallel.harness import run_ranks
from tests.parallel.workers import step_max


def test_the_trainers_max_is_the_max_over_the_ranks_and_counted():
    values = [5, 1 << 40, -3]  # int64: a peak memory past 2**32 bytes, a signal number, a negative
    world = 3
    shifted = [[v + (r if i % 2 else -r) for i, v in enumerate(values)] for r in range(world)]
    oracle = [max(col) for col in zip(*shifted, strict=True)]
    for got, calls, sent in run_ranks(step_max, world, values):
        assert got == oracle
        assert calls == {"max": 1} and sent == {"max": 8 * len(values)}


def test_one_process_max_is_the_values_and_sends_nothing():
    comms.STATS.reset()
    t = torch.tensor([3, 7])
    assert comms.all_reduce_max(t, None).tolist() == [3, 7] and comms.STATS.total == 0
