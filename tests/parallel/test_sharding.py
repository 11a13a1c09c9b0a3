"""Sharding of a window over cp ranks (zigzag and contiguous) and the layout checks, in one process."""

from __future__ import annotations

import pytest
import torch

from lcft.errors import LcftError
from lcft.parallel import (
    ContextParallelRunner,
    ParallelConfig,
    ParallelState,
    ShardLayout,
    check_length,
    check_world,
)
from lcft.parallel.mesh import init_parallel, single_process_state


def test_zigzag_chunks_pair_each_rank_with_its_mirror():
    layout = ShardLayout(length=8 * 16, cp=4, block=16, layout="zigzag")
    assert [layout.chunks(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    # Causal work of a chunk grows with its index: each zigzag pair sums to the same total.
    assert len({a + b for a, b in (layout.chunks(r) for r in range(4))}) == 1


def test_contiguous_chunks_are_consecutive():
    layout = ShardLayout(length=4 * 32, cp=2, block=32, layout="contiguous")
    assert [layout.chunks(r) for r in range(2)] == [(0, 1), (2, 3)]
    assert torch.equal(layout.positions(1), torch.arange(64, 128))


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shards_partition_the_window_and_positions_are_global(layout, cp):
    lay = ShardLayout(length=2 * cp * 8 * 3, cp=cp, block=8, layout=layout)
    x = torch.arange(2 * lay.length).reshape(2, lay.length)  # (B, L): token value = its global position
    parts = [lay.shard(x, r) for r in range(cp)]
    for r, part in enumerate(parts):
        assert part.shape == (2, lay.local_length)
        assert torch.equal(part[0], lay.positions(r))  # positions name exactly the tokens held
        assert torch.equal(lay.block_ids(r), lay.positions(r)[:: lay.block] // lay.block)
    assert torch.equal(torch.sort(torch.cat([lay.positions(r) for r in range(cp)])).values,
                       torch.arange(lay.length))
    assert torch.equal(lay.unshard(parts), x)
    for c in range(2 * cp):
        r, s = lay.owner(c)
        assert lay.chunks(r)[s] == c


def test_shard_batch_cuts_only_window_tensors():
    lay = ShardLayout(length=64, cp=2, block=16)
    batch = {"input_ids": torch.zeros(1, 64), "weights": torch.ones(1, 64), "meta": torch.zeros(3)}
    out = lay.shard_batch(batch, 1)
    assert out["input_ids"].shape == (1, 32) and out["weights"].shape == (1, 32) and out["meta"].shape == (3,)


@pytest.mark.parametrize("length,cp,block", [(1000, 2, 64), (192, 2, 64), (64 * 5, 4, 16), (0, 2, 16)])
def test_length_not_a_multiple_of_2_cp_block_is_a_clear_error(length, cp, block):
    with pytest.raises(LcftError, match=rf"not a multiple of 2\*cp\*block = {2 * cp * block}"):
        check_length(length, cp, block)
    with pytest.raises(LcftError, match="not a multiple"):
        ShardLayout(length, cp, block)
    state = ParallelState(world=cp, rank=0, cp=cp, dp=1, cp_rank=0, dp_rank=0)
    runner = ContextParallelRunner(state, ParallelConfig(cp=cp), block)
    with pytest.raises(LcftError, match="not a multiple"):
        runner.check(length)
    with pytest.raises(LcftError, match="not a multiple"):  # sharding refuses before any collective
        runner.shard({"input_ids": torch.zeros(1, length, dtype=torch.long)})


def test_world_not_divisible_by_cp_is_a_clear_error():
    assert check_world(8, 4) == 2
    with pytest.raises(LcftError, match="world size 6 is not divisible by cp=4"):
        check_world(6, 4)
    with pytest.raises(LcftError, match="world size 1 is not divisible by cp=2"):
        init_parallel(ParallelConfig(cp=2))  # one process, no process group: refused before any collective


def test_bad_config_values():
    with pytest.raises(LcftError, match="cp_layout"):
        ParallelConfig(cp=2, cp_layout="diagonal")
    with pytest.raises(LcftError, match="cp_kv"):
        ParallelConfig(cp=2, cp_kv="some")
    with pytest.raises(LcftError, match="at least 1"):
        ParallelConfig(cp=0)


def test_single_process_runner_is_the_plain_model():
    """cp=1: no sharding, no positions (the loss is the trainer's: tests/train/test_step.py)."""
    runner = ContextParallelRunner(single_process_state(), ParallelConfig(), 16)
    batch = {"input_ids": torch.zeros(1, 48, dtype=torch.long)}
    local, pos = runner.shard(batch)
    assert pos is None and local["input_ids"] is batch["input_ids"]
    ids = batch["input_ids"]
    assert runner.local(ids) is ids and runner.gather(ids) is ids
