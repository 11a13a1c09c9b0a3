"""Group-centric Triton sparse attention vs the dense-mask reference under the interpreter (GQA 1/2/4/8, D=24)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import pytest
import torch

from lcft.errors import LcftError
from lcft.kernels.sparse_reference import sparse_attention_reference
from lcft.kernels.triton_tiles import tile_config

pytestmark = [pytest.mark.triton, pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs triton and CUDA or TRITON_INTERPRET=1")]


def random_indices(b: int, hkv: int, n_q: int, n_k: int, budget: int, offset: int, seed: int) -> torch.Tensor:
    """Valid (B, Hkv, nQ, budget) rows: own block, distinct earlier blocks, -1 padding, ascending."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((b, hkv, n_q, budget), -1, dtype=torch.int32)
    for i in range(b):
        for h in range(hkv):
            for j in range(n_q):
                own = offset + j
                earlier = torch.randperm(own, generator=gen)[: int(torch.randint(0, budget, (1,), generator=gen))]
                row = torch.cat([earlier, torch.tensor([own])]).sort().values
                out[i, h, j, : row.numel()] = row.int()
    return out


def run(fn, q, k, v, idx, dout, **kw):
    t = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*t, idx, **kw)
    return (out.detach(), *torch.autograd.grad(out, t, dout))


@pytest.mark.parametrize("tiles", ["fp32", "bf16", "per-kernel"])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_group_centric_kernels_equal_reference(group, tiles, monkeypatch):
    import lcft.kernels.sparse_triton as st

    monkeypatch.setattr(st, "_SEG", 2)  # split key rows over segments: the partial-sum path runs too
    bs = 16
    if tiles == "bf16":  # the 2-byte tile shapes (more rows, whole-block dK/dV programs) on exact fp32 data
        bs, orig = 32, st.tile_config
        monkeypatch.setattr(st, "tile_config", lambda cap, dt, *a: replace(orig(cap, torch.bfloat16, *a), prec="ieee"))
    if tiles == "per-kernel":  # as the compiled-ahead table sets them: dQ and dK/dV tiles unlike the forward's
        bs, orig = 32, st.tile_config

        def split(cap, dt, *a):
            t = replace(orig(cap, torch.bfloat16, *a), prec="ieee")
            t = t.with_kernel("dq", max(16 // t.gp, t.m // 2), t.block_n // 2, 8, 1)
            return t.with_kernel("dkv", t.dkv_m, t.kn // 2, 8, 1)
        monkeypatch.setattr(st, "tile_config", split)
    b, hkv, d, n_blk, first = 1, 2, 24, 6, 2  # D=24: not a power of two (padded to 32)
    gen = torch.Generator().manual_seed(group)
    lk, lq = n_blk * bs, (n_blk - first) * bs  # a query slice starting at block 2, as context parallelism uses
    q = torch.randn(b, hkv * group, lq, d, generator=gen)
    k, v = (torch.randn(b, hkv, lk, d, generator=gen) for _ in range(2))
    dout = torch.randn(b, hkv * group, lq, d, generator=gen)
    idx = random_indices(b, hkv, n_blk - first, n_blk, budget=3, offset=first, seed=group)
    kw = dict(block_size=bs, q_block_offset=first)
    got = run(st.sparse_attention_triton, q, k, v, idx, dout, **kw)
    want = run(sparse_attention_reference, q, k, v, idx, dout, **kw)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = (g - w).abs().max().item()
        assert err <= (1e-5 if name == "out" else 1e-4), f"{name}: max error {err:.2e}"


@pytest.mark.parametrize("group", [1, 3, 8])
def test_tiles_cover_every_head_of_a_group(group):
    for dtype in (torch.float32, torch.bfloat16):
        t = tile_config((9, 0), dtype, 96, 128, group)
        assert t.gp >= group and t.bd == 128 and t.block % t.m == 0 and t.block % t.kn == 0
        assert t.block % t.dkv_m == 0 and t.rows >= 16


def test_unsupported_block_size_names_the_option():
    with pytest.raises(LcftError, match="--block-size"):
        tile_config((9, 0), torch.bfloat16, 64, 96, 1)


def test_split_key_rows_round_once_in_bf16(monkeypatch):
    """A key block chosen by more query blocks than one dK/dV program takes (the sink, chosen by all) gets the
    gradient of an unsplit row up to one bf16 rounding: its partial sums are added in fp32 and rounded once."""
    import lcft.kernels.sparse_triton as st

    b, hkv, group, d, bs, n_blk = 1, 1, 2, 32, 16, 12
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(b, hkv * group, n_blk * bs, d, generator=gen).bfloat16()
    k, v = (torch.randn(b, hkv, n_blk * bs, d, generator=gen).bfloat16() for _ in range(2))
    dout = torch.randn(b, hkv * group, n_blk * bs, d, generator=gen).bfloat16()
    rows = [sorted({0, j - 1, j} - {-1}) for j in range(n_blk)]  # sink, previous and own block
    idx = torch.tensor([r + [-1] * (3 - len(r)) for r in rows], dtype=torch.int32).view(b, hkv, n_blk, 3)
    whole = run(st.sparse_attention_triton, q, k, v, idx, dout, block_size=bs)
    monkeypatch.setattr(st, "_SEG", 1)  # every entry its own segment: the sink row is split n_blk ways
    split = run(st.sparse_attention_triton, q, k, v, idx, dout, block_size=bs)
    for name, w, g in zip(("dk", "dv"), whole[2:], split[2:], strict=True):
        w, g = w.float(), g.float()
        ulp = torch.exp2(torch.floor(torch.log2(w.abs().clamp(min=1e-30))) - 7)  # bf16: 8 significant bits
        assert ((g - w).abs() <= ulp).all(), f"{name}: {((g - w).abs() / ulp).max().item():.1f} ulp apart"
