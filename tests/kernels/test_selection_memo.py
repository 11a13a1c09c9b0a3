"""SelectionMemo: a region's first run records its selections in call order, every later run replays them."""

from __future__ import annotations

import pytest
import torch

from lcft.kernels.selection_memo import SelectionMemo, remembered


def counter():
    calls = []

    def select() -> torch.Tensor:
        calls.append(1)
        return torch.full((1,), len(calls), dtype=torch.int32)

    return select, calls


def test_outside_a_region_every_call_selects():
    select, calls = counter()
    assert [int(remembered(select)) for _ in range(3)] == [1, 2, 3]
    assert len(calls) == 3


def test_later_runs_replay_the_first_runs_selections_in_order():
    select, calls = counter()
    memo = SelectionMemo()
    with memo.run():
        first = [int(remembered(select)) for _ in range(2)]
    for _ in range(2):  # a recompute, and another (backward through a retained graph)
        with memo.run():
            assert [int(remembered(select)) for _ in range(2)] == first == [1, 2]
    assert len(calls) == 2
    assert int(remembered(select)) == 3  # the region is left: selecting again


def test_a_recompute_asking_for_more_than_its_forward_made_is_a_bug():
    select, _ = counter()
    memo = SelectionMemo()
    with memo.run():
        remembered(select)
    with memo.run(), pytest.raises(RuntimeError, match="selection 2; its forward made 1"):
        remembered(select)
        remembered(select)
