"""A selector defined outside the library, registered by name, runs through every kernel and CP at cp=2.

`StridedSelector` is the whole plugin: it is registered at import (so spawned CP ranks, which import this
module to run `_cp_ranks`, know it too) and checked against dense attention with the mask it implies.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from lcft.errors import LcftError
from lcft.kernels import SparseSpec, get_selector, register_selector, select_blocks, sparse_attention
from lcft.model import AttentionConfig, Llama, LlamaConfig

STRIDE = 3
B, HQ, HKV, D, BLOCK, L = 2, 4, 2, 16, 16, 256
SPEC = SparseSpec(block_size=BLOCK, top_k=2, local_blocks=0, sink_blocks=0, selector="strided_test")
RUN_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
TRITON = pytest.param("triton", marks=[pytest.mark.triton, pytest.mark.skipif(
    not RUN_TRITON or importlib.util.find_spec("triton") is None, reason="needs CUDA or TRITON_INTERPRET=1")])


class StridedSelector:
    """Fixed pattern: query block i reads blocks i, i-s, i-2s, ... (top_k of them before i), whatever the keys."""

    def summarise(self, k: torch.Tensor, spec: SparseSpec) -> torch.Tensor:
        b, h, length, _ = k.shape
        return k.new_zeros(b, h, length // spec.block_size, 1)  # (B, Hkv, nK, 1): the pattern needs no content

    def select(self, q: torch.Tensor, summary: torch.Tensor, spec: SparseSpec, q_block_offset: int
               ) -> torch.Tensor:
        n_q = q.shape[2] // spec.block_size
        own = torch.arange(q_block_offset, q_block_offset + n_q, device=q.device)[:, None]  # (nQ, 1)
        back = own - STRIDE * torch.arange(spec.top_k, -1, -1, device=q.device)  # (nQ, top_k + 1) ascending
        rows = torch.where(back >= 0, back, torch.iinfo(torch.long).max).sort(dim=-1).values  # valid first
        rows = torch.where(rows == torch.iinfo(torch.long).max, -1, rows).to(torch.int32)
        return rows.expand(summary.shape[0], summary.shape[1], n_q, -1).contiguous()  # (B, Hkv, nQ, top_k + 1)


register_selector("strided_test", StridedSelector)


def strided_mask(length: int, spec: SparseSpec) -> torch.Tensor:
    """(L, L) bool the pattern implies, by its definition: causal, block distance a multiple of STRIDE, at most
    top_k strides back."""
    pos = torch.arange(length)
    qb, kb = (pos // spec.block_size)[:, None], (pos // spec.block_size)[None, :]
    dist = qb - kb
    return (pos[None, :] <= pos[:, None]) & (dist % STRIDE == 0) & (dist // STRIDE <= spec.top_k)


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: SparseSpec) -> torch.Tensor:
    """Dense SDPA with the explicit mask: shares no code with the sparse kernels."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=strided_mask(q.shape[2], spec), enable_gqa=True)


def inputs(length: int = L, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(B, HQ, length, D, generator=g), "k": torch.randn(B, HKV, length, D, generator=g),
            "v": torch.randn(B, HKV, length, D, generator=g), "gout": torch.randn(B, HQ, length, D, generator=g)}


def out_and_grads(fn, x: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    q, k, v = (x[n].clone().requires_grad_() for n in "qkv")
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), x["gout"])]


@pytest.mark.parametrize("impl", ["reference", "cpu", TRITON, "auto"])
def test_registered_selector_runs_every_impl(impl):
    length = 128 if impl == "triton" else L
    x = inputs(length)
    want = out_and_grads(lambda q, k, v: oracle(q, k, v, SPEC), x)
    got = out_and_grads(lambda q, k, v: sparse_attention(q, k, v, SPEC, impl=impl), x)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{impl} {n}: {m}")


def test_budget_covering_all_blocks_does_not_mean_dense_for_this_selector():
    """8 blocks <= budget 9, yet the pattern skips blocks: 'auto' must not take the dense shortcut."""
    spec = SparseSpec(block_size=BLOCK, top_k=6, local_blocks=1, sink_blocks=1, selector="strided_test")
    x = inputs(8 * BLOCK, seed=1)
    got = sparse_attention(x["q"], x["k"], x["v"], spec, impl="auto")
    torch.testing.assert_close(got, oracle(x["q"], x["k"], x["v"], spec), atol=1e-5, rtol=1e-5)
    dense = F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True, enable_gqa=True)
    assert (got - dense).abs().max() > 1e-3


def test_select_blocks_uses_the_spec_selector_at_an_offset():
    x = inputs()
    idx = select_blocks(x["q"][:, :, 5 * BLOCK:9 * BLOCK], x["k"], SPEC, q_block_offset=5)  # (B, Hkv, 4, 3)
    assert idx.shape == (B, HKV, 4, 3) and idx.dtype == torch.int32
    assert idx[1, 1].tolist() == [[2, 5, -1], [0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_unknown_selector_is_a_clear_error_listing_the_known_ones():
    with pytest.raises(LcftError, match=r"unknown block selector 'nope'; known: .*block_mean.*strided_test"):
        get_selector("nope")
    bad = AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=16, selector="nope"))
    with pytest.raises(LcftError, match="unknown block selector"):
        Llama(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, attention=bad))


def _cp_ranks(rank: int, world: int, cases: list[dict], full: dict[str, torch.Tensor], attn: dict) -> list[dict]:
    """Runs on each spawned rank: importing this module for it registered the selector there."""
    from tests.parallel.workers import attention_cases

    return attention_cases(rank, world, cases, full, attn)


@pytest.mark.distributed
def test_registered_selector_under_context_parallelism_equals_one_process():
    from lcft.parallel import ShardLayout
    from tests.parallel.harness import run_ranks

    full = inputs()
    want = out_and_grads(lambda q, k, v: oracle(q, k, v, SPEC), full)
    attn = {"block_size": BLOCK, "top_k": SPEC.top_k, "local_blocks": 0, "sink_blocks": 0,
            "selector": "strided_test", "impl": "cpu"}
    cases = [{"backend": "sparse", "layout": lay, "kv": kv} for lay in ("zigzag", "contiguous")
             for kv in ("all", "selected", "stream")]
    results = run_ranks(_cp_ranks, 2, cases, full, attn)
    for i, case in enumerate(cases):
        layout = ShardLayout(L, 2, BLOCK, case["layout"])
        for j, name in enumerate(("out", "dq", "dk", "dv")):
            got = layout.unshard([r[i][name] for r in results], dim=2)
            torch.testing.assert_close(got, want[j], atol=1e-5, rtol=1e-5, msg=lambda m, n=name, c=case: f"{c} {n}: {m}")
