"""Block selection against a brute-force oracle: top-k by the defined score, ties, causality, mandatory blocks."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from lcft.errors import LcftError
from lcft.kernels import SparseSpec, select_blocks
from lcft.kernels.selection import block_means

_NO_TRITON = not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1") or (
    importlib.util.find_spec("triton") is None)


def triton_test(fn):
    """Mark a test `triton`; skip it unless CUDA or the interpreter (TRITON_INTERPRET=1, set by make test) runs it."""
    return pytest.mark.triton(pytest.mark.skipif(_NO_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")(fn))


def brute_force(q, k, *, block_size, top_k, local_blocks, sink_blocks):
    """Selection by the definition, in float64 with explicit loops (independent of the chunked code)."""
    b, hq, length, d = q.shape
    hkv = k.shape[1]
    group, n = hq // hkv, length // block_size
    budget = top_k + local_blocks + sink_blocks + 1
    qm = q.double().reshape(b, hq, n, block_size, d).mean(3)
    km = k.double().reshape(b, hkv, n, block_size, d).mean(3)
    out = torch.full((b, hkv, n, budget), -1, dtype=torch.int32)
    for bi in range(b):
        for h in range(hkv):
            for i in range(n):
                mandatory = {i} | {j for j in range(i - local_blocks, i) if j >= 0} | set(range(min(sink_blocks, i + 1)))
                cands = []
                for j in range(i):
                    if j in mandatory:
                        continue
                    score = sum(float(qm[bi, h * group + g, i] @ km[bi, h, j]) for g in range(group))
                    cands.append((-score, j))
                chosen = sorted(mandatory | {j for _, j in sorted(cands)[:top_k]})
                out[bi, h, i, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


CASES = [  # (B, Hq, Hkv, L, D, block, top_k, local, sink)
    (1, 4, 1, 512, 32, 16, 3, 1, 1),
    (2, 4, 2, 1024, 64, 32, 5, 2, 0),
    (1, 4, 4, 2048, 32, 64, 8, 0, 1),
    (2, 4, 2, 768, 32, 16, 1, 0, 0),
    (1, 4, 1, 640, 64, 16, 7, 2, 1),
]


@pytest.mark.parametrize("case", CASES)
def test_selection_matches_brute_force(case):
    b, hq, hkv, length, d, bs, top_k, local, sink = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    q = torch.randn(b, hq, length, d, generator=gen)
    k = torch.randn(b, hkv, length, d, generator=gen)
    got = select_blocks(q, k, SparseSpec(block_size=bs, top_k=top_k, local_blocks=local, sink_blocks=sink))
    assert got.dtype == torch.int32 and got.shape == (b, hkv, length // bs, top_k + local + sink + 1)
    want = brute_force(q, k, block_size=bs, top_k=top_k, local_blocks=local, sink_blocks=sink)
    assert torch.equal(got, want)


def test_selection_structure():
    """Causal, own/local/sink always present, ascending rows, padding only at the end."""
    torch.manual_seed(1)
    bs, top_k, local, sink = 16, 4, 2, 1
    q, k = torch.randn(1, 4, 1024, 32), torch.randn(1, 2, 1024, 32)
    idx = select_blocks(q, k, SparseSpec(block_size=bs, top_k=top_k, local_blocks=local, sink_blocks=sink)).long()
    for i in range(idx.shape[2]):
        row = idx[:, :, i]  # (B, Hkv, budget)
        valid = row[row >= 0]
        assert int(valid.max()) == i  # own block present, nothing in the future
        for j in [i, *range(max(0, i - local), i), *range(min(sink, i + 1))]:
            assert bool((row == j).any(-1).all())
        n_valid = min(i + 1, top_k + local + sink + 1)
        assert bool((row[..., :n_valid] >= 0).all()) and bool((row[..., n_valid:] == -1).all())
        assert bool((row[..., :n_valid].diff(dim=-1) > 0).all())


def test_ties_go_to_lower_index():
    bs = 16
    torch.manual_seed(2)
    q = torch.randn(1, 2, 16 * bs, 8)
    k = torch.randn(1, 1, 16 * bs, 8) * 0.01
    # Blocks 3, 7 and 9 get the same, large keys (equal summaries, so exactly equal scores for every query).
    hot = q[0, :, 15 * bs:].mean(dim=1).sum(dim=0)  # (8,) query block 15's summed mean
    for j in (3, 7, 9):
        k[0, 0, j * bs:(j + 1) * bs] = hot * 10
    idx = select_blocks(q, k, SparseSpec(block_size=bs, top_k=2, local_blocks=0, sink_blocks=0))
    assert idx[0, 0, 15].tolist() == [3, 7, 15]
    # All keys equal: every score ties, so the lowest eligible blocks win.
    idx = select_blocks(q, torch.ones(1, 1, 16 * bs, 8), SparseSpec(block_size=bs, top_k=3, local_blocks=1, sink_blocks=1))
    assert idx[0, 0, 15].tolist() == [0, 1, 2, 3, 14, 15]


def test_offset_and_summary_equal_slice_of_full_call():
    """A context-parallel rank's call (query slice + all-gathered summaries) equals the full call's slice."""
    torch.manual_seed(3)
    bs, spec = 32, SparseSpec(block_size=32, top_k=4, local_blocks=1, sink_blocks=1)
    q, k = torch.randn(2, 4, 2048, 32), torch.randn(2, 2, 2048, 32)
    full = select_blocks(q, k, spec)
    summary = block_means(k, bs)  # (B, Hkv, nK, D)
    for first, count in ((0, 16), (16, 16), (40, 24), (63, 1)):
        part = q[:, :, first * bs:(first + count) * bs]
        got = select_blocks(part, None, spec, q_block_offset=first, k_summary=summary)
        assert torch.equal(got, full[:, :, first:first + count])
        got_k = select_blocks(part, k, spec, q_block_offset=first)
        assert torch.equal(got_k, full[:, :, first:first + count])


def test_selection_bad_input():
    q = torch.randn(1, 2, 100, 8)
    with pytest.raises(ValueError, match="multiple of block_size"):
        select_blocks(q, q, SparseSpec(block_size=16, top_k=1, local_blocks=0, sink_blocks=0))
    q = torch.randn(1, 2, 64, 8)
    with pytest.raises(ValueError, match="reach past"):
        select_blocks(q, q, SparseSpec(block_size=16, top_k=1, local_blocks=0, sink_blocks=0), q_block_offset=2)
    with pytest.raises(LcftError, match="top_k"):
        select_blocks(q, q, SparseSpec(block_size=16, top_k=-1, local_blocks=0, sink_blocks=0))


@triton_test
@pytest.mark.parametrize(("case", "offset"), [(CASES[0], 0), (CASES[1], 9), ((1, 4, 2, 2048, 32, 16, 16, 1, 1), 70)])
def test_triton_selection_matches_brute_force(case, offset):
    """Tiled score + running top-k kernel: same ids as the definition, also for a query slice + summaries."""
    from lcft.kernels.selection_triton import select_blocks_triton

    b, hq, hkv, length, d, bs, top_k, local, sink = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    q = torch.randn(b, hq, length, d, generator=gen)
    k = torch.randn(b, hkv, length, d, generator=gen)
    kw = dict(block_size=bs, top_k=top_k, local_blocks=local, sink_blocks=sink)
    want = brute_force(q, k, **kw)[:, :, offset:]
    got = select_blocks_triton(q[:, :, offset * bs:], block_means(k, bs), SparseSpec(**kw), offset)
    assert torch.equal(got, want)


@triton_test
@pytest.mark.parametrize("top_k", [1, 3])
def test_triton_selection_ties_go_to_lower_index(top_k):
    from lcft.kernels.selection_triton import select_blocks_triton

    bs = 16
    q = torch.randn(1, 2, 40 * bs, 16, generator=torch.Generator().manual_seed(5))
    spec = SparseSpec(block_size=bs, top_k=top_k, local_blocks=1, sink_blocks=1)
    idx = select_blocks_triton(q, block_means(torch.ones(1, 1, 40 * bs, 16), bs), spec)
    assert idx[0, 0, 39].tolist() == [0, *range(1, 1 + top_k), 38, 39]


def test_topk_rows_with_many_ties_matches_sorting():
    """The fast topk path and its exact tie fallback pick (value desc, id asc), with excluded (-inf) columns."""
    from lcft.kernels.selection import topk_rows

    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        n, k = int(torch.randint(1, 40, (1,), generator=gen)), int(torch.randint(1, 8, (1,), generator=gen))
        s = torch.randint(0, 4, (6, n), generator=gen).float()  # few distinct values: ties everywhere
        s[torch.rand(6, n, generator=gen) < 0.3] = float("-inf")
        got = topk_rows(s, k).sort(dim=1).values
        for i in range(6):
            best = sorted((-s[i, j].item(), j) for j in range(n) if s[i, j] > float("-inf"))[:k]
            assert got[i].tolist() == sorted([j for _, j in best] + [-1] * (k - len(best)))
