"""Context parallelism for the HF families: a Qwen3-style model (qk-norm, q/k/v/o bias, GQA, head_dim 24) and a
Mixtral-style one (4 experts, top-2) under cp=2 give the loss and gradients of one process; and the core swap
refuses a sliding window it would drop."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lcft.errors import LcftError
from lcft.kernels import chunked_cross_entropy
from lcft.model import Llama, LlamaConfig
from lcft.model.config import AttentionConfig
from lcft.parallel.activations import apply_activation_checkpointing
from tests.parallel.harness import run_ranks

pytestmark = pytest.mark.distributed

L = 256
FAMILIES = {
    "qwen3": dict(model_type="qwen3", qk_norm=True, attention_bias=True, o_proj_bias=True, head_dim=24),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
}
# (family, backend, layout, kv, activation checkpointing)
CASES = [("qwen3", "sparse", "zigzag", "all", "block"), ("qwen3", "dense", "zigzag", "selected", "none"),
         ("mixtral", "sparse", "zigzag", "stream", "none"), ("mixtral", "dense", "contiguous", "all", "block")]


def family_model(family: str, backend: str) -> Llama:
    attention = AttentionConfig.from_dict({"backend": backend, "block_size": 16, "top_k": 2, "local_blocks": 1,
                                           "sink_blocks": 1, "impl": "cpu"})
    cfg = LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=1e4, attention=attention,
                      **FAMILIES[family])
    torch.manual_seed(0)
    model = Llama(cfg)
    with torch.no_grad():  # non-zero biases and norm gains, larger weights: every part of the block matters
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    return model


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 9, (2, L), generator=g)  # (B, L) DNA tokens
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    labels[0, 30:120] = -100  # uneven counted tokens across the shards
    return {"input_ids": ids, "labels": labels}


def cp_steps(rank: int, world: int, cases: list[tuple], batch: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Per case: one forward/backward of the family model under cp=world through the trainer's loss path."""
    from lcft.parallel import ContextParallelRunner, ParallelConfig, apply_context_parallel, init_parallel
    from tests.parallel.workers import trainer_step

    out = []
    for family, backend, layout, kv, checkpointing in cases:
        pcfg = ParallelConfig(cp=world, cp_layout=layout, cp_kv=kv)
        state = init_parallel(pcfg)
        model = apply_context_parallel(family_model(family, backend), state, pcfg)
        apply_activation_checkpointing(model, checkpointing, seq_chunk=32)
        runner = ContextParallelRunner(state, pcfg, 16)
        loss = trainer_step(model, runner, batch)
        out.append({"loss": loss, "grads": {n: p.grad.clone() for n, p in model.named_parameters()}})
    return out


def one_process(family: str, backend: str, batch) -> dict:
    model = family_model(family, backend)
    loss_sum, count = chunked_cross_entropy(model.hidden_states(batch["input_ids"]), model.lm_head_weight,
                                            batch["labels"], chunk=96)
    (loss_sum / count).backward()
    return {"loss": (loss_sum / count).item(), "grads": {n: p.grad for n, p in model.named_parameters()}}


@pytest.fixture(scope="module")
def runs():
    batch = _batch()
    return run_ranks(cp_steps, 2, CASES, batch), batch


@pytest.mark.parametrize("i", range(len(CASES)), ids=["-".join(c) for c in CASES])
def test_cp2_step_of_each_family_equals_one_process(runs, i):
    cp2, batch = runs
    want = one_process(CASES[i][0], CASES[i][1], batch)
    for rank in cp2:
        got = rank[i]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        for name, g in want["grads"].items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_context_parallel_refuses_a_dense_sliding_window():
    from lcft.parallel import ParallelConfig, apply_context_parallel
    from lcft.parallel.mesh import ParallelState

    model = Llama(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=2, model_type="mistral", sliding_window=64))
    state = ParallelState(world=2, rank=0, cp=2, dp=1, cp_rank=0, dp_rank=0, cp_group=None)
    with pytest.raises(LcftError, match="sliding_window"):
        apply_context_parallel(model, state, ParallelConfig(cp=2))
