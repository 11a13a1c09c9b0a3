"""A full training step of the tiny model under cp=2 (torch DDP over the cp ranks) equals one process."""

from __future__ import annotations

import pytest
import torch

from lcft.kernels import chunked_cross_entropy
from tests.parallel.harness import run_ranks
from tests.parallel.workers import tiny_model, train_steps

pytestmark = pytest.mark.distributed

L = 512
# (backend, layout, kv, activation checkpointing; offload = block with the block inputs offloaded)
CASES = [("sparse", "zigzag", "all", "none"), ("sparse", "contiguous", "selected", "block"),
         ("dense", "zigzag", "selected", "none"), ("sparse", "zigzag", "stream", "block"),
         ("sparse", "zigzag", "all", "offload")]


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 9, (2, L), generator=g)  # (B, L) DNA tokens
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    labels[0, 40:300] = -100  # an N run: uneven counted tokens across the shards
    return {"input_ids": ids, "labels": labels}


def _one_process(backend: str, batch) -> dict:
    model = tiny_model(backend)
    hidden = model.hidden_states(batch["input_ids"])  # (B, L, H)
    loss_sum, count = chunked_cross_entropy(hidden, model.lm_head_weight, batch["labels"], chunk=96)
    loss = loss_sum / count
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad for n, p in model.named_parameters()}}


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    return _batch()


@pytest.fixture(scope="module")
def cp2(batch):
    return run_ranks(train_steps, 2, CASES, batch)


@pytest.fixture(scope="module")
def oracle(batch):
    return {backend: _one_process(backend, batch) for backend in {c[0] for c in CASES}}


@pytest.mark.parametrize("i", range(len(CASES)), ids=["-".join(c) for c in CASES])
def test_cp2_step_equals_one_process(cp2, oracle, i):
    want = oracle[CASES[i][0]]
    for rank in cp2:  # every cp rank reports the window's loss and holds the synchronised gradient
        got = rank[i]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        assert got["grads"].keys() == want["grads"].keys()
        for name, g in want["grads"].items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("i", [i for i, c in enumerate(CASES) if c[0] == "sparse" and c[2] != "all"],
                         ids=lambda i: "-".join(CASES[i]))
def test_key_block_summaries_are_exchanged_once_per_layer(cp2, i):
    """With block checkpointing too: the recompute reuses its forward's selection, so no second exchange."""
    layers = tiny_model("sparse").config.num_hidden_layers
    for rank in cp2:
        assert rank[i]["calls"]["summary"] == layers
