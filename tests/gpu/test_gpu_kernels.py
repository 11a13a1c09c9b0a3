"""On a CUDA GPU: compiled Triton sparse attention and selection vs oracles, 4K-64K, bf16 and fp32, with GQA.

Oracles: the dense-mask reference (fp64) at 4K; above it the chunked PyTorch implementation in fp64 on the same
GPU (itself checked against the reference on CPU by tests/kernels); for the selection, fp64 scores and the
PyTorch selection's mandatory blocks.
"""

from __future__ import annotations

import pytest
import torch

from lcft.kernels import SparseSpec, select_blocks, sparse_attention_with_indices
from lcft.kernels.selection import block_means, candidate_mask, group_query_sums, select_blocks_torch
from lcft.kernels.triton_tiles import check_sparse_kernels_fit

pytestmark = pytest.mark.gpu
SPEC = SparseSpec(block_size=128, top_k=8, local_blocks=1, sink_blocks=1)
# bf16: the kernels and the oracle round the same inputs; errors relative to the output's scale
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def _inputs(length: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(1, h, length, d, device="cuda", generator=gen).to(dtype)  # noqa: E731
    return mk(hq), mk(hkv), mk(hkv), mk(hq)


def _fwd_bwd(q, k, v, dout, idx, impl: str, dtype: torch.dtype):
    t = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out = sparse_attention_with_indices(*t, idx, block_size=SPEC.block_size, impl=impl)
    return [out.detach(), *torch.autograd.grad(out, t, dout.to(dtype))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("length", "hq", "hkv", "d"), [(4096, 8, 2, 64), (16384, 8, 1, 96), (65536, 4, 2, 128)])
def test_triton_sparse_fwd_bwd_equals_oracle(length, hq, hkv, d, dtype):
    check_sparse_kernels_fit(torch.device("cuda"), dtype, d, SPEC.block_size, hq // hkv)
    q, k, v, dout = _inputs(length, hq, hkv, d, dtype, seed=length + d)
    idx = select_blocks(q, k, SPEC)
    oracle = "reference" if length <= 4096 else "cpu"
    want = _fwd_bwd(q, k, v, dout, idx, oracle, torch.float64)
    got = _fwd_bwd(q, k, v, dout, idx, "triton", dtype)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = ((g.double() - w).abs().max() / w.abs().max().clamp(min=1e-6)).item()
        assert err <= TOL[dtype], f"{name}: max error {err:.2e} relative to max |{name}|"


@pytest.mark.parametrize("length", [4096, 65536])
def test_triton_selection_is_a_top_k_of_the_exact_scores(length):
    """The Triton selector's blocks: the mandatory ones as the PyTorch selection takes them, and a top-k of the
    scores computed in fp64 up to fp32 rounding (a near-tie may go either way in another summation order)."""
    q, k, _, _ = _inputs(length, 8, 2, 64, torch.float32, seed=1)
    summary = block_means(k, SPEC.block_size)  # (1, Hkv, nK, D)
    got = select_blocks(q, None, SPEC, k_summary=summary)  # CUDA tensors: the Triton selector
    want = select_blocks_torch(q, summary, SPEC)
    n = summary.shape[2]
    chosen = [torch.zeros(*x.shape[:3], n + 1, dtype=torch.bool, device="cuda").scatter_(-1, x.long() % (n + 1), True)
              [..., :n] for x in (got, want)]  # (1, Hkv, nQ, nK); -1 padding lands in the dropped column
    eligible = candidate_mask(torch.arange(n, device="cuda"), n, SPEC.local_blocks, SPEC.sink_blocks)  # (nQ, nK)
    assert torch.equal(chosen[0] & ~eligible, chosen[1] & ~eligible)  # sink, local and own blocks
    assert torch.equal((chosen[0] & eligible).sum(-1), (chosen[1] & eligible).sum(-1))
    qs = group_query_sums(q, 2, SPEC.block_size).double()  # (1, Hkv, nQ, D): the fp32 means both selectors see
    scores = qs @ summary.double().transpose(-1, -2)  # (1, Hkv, nQ, nK), exact
    inf = torch.tensor(float("inf"), dtype=torch.float64, device="cuda")
    lowest_in = torch.where(chosen[0] & eligible, scores, inf).amin(-1)  # (1, Hkv, nQ)
    highest_out = torch.where(~chosen[0] & eligible, scores, -inf).amax(-1)
    tol = 1e-5 * scores.abs().amax()
    assert bool((lowest_in >= highest_out - tol).all()), (highest_out - lowest_in).max().item()
