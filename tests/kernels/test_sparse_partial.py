"""Attention split over pieces of the keys and merged by log-sum-exp equals the reference on all keys (fp32)."""

from __future__ import annotations

import pytest
import torch

from lcft.kernels.sparse import select_blocks
from lcft.kernels.sparse_partial import partial_attention_backward, partial_attention_forward
from lcft.kernels.sparse_reference import sparse_attention_reference
from lcft.kernels.spec import SparseSpec

B, HQ, HKV, D, BLOCK, NK = 2, 4, 2, 16, 8, 16
HALF = NK // 2  # queries: the last half of the blocks


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(B, HQ, HALF * BLOCK, D, generator=g),
            "k": torch.randn(B, HKV, NK * BLOCK, D, generator=g), "v": torch.randn(B, HKV, NK * BLOCK, D, generator=g),
            "gout": torch.randn(B, HQ, HALF * BLOCK, D, generator=g)}


def _restrict(indices: torch.Tensor, piece_ids: torch.Tensor) -> torch.Tensor:
    """Global block ids -> positions in the piece (blocks `piece_ids`), rows ascending, -1 padded."""
    pos_of = torch.full((NK,), -1, dtype=torch.long)
    pos_of[piece_ids] = torch.arange(piece_ids.numel())
    idx = indices.long()
    pos = torch.where(idx >= 0, pos_of[idx.clamp(min=0)], -1)
    big = 1 << 30
    pos = torch.where(pos >= 0, pos, big).sort(dim=-1).values
    return torch.where(pos == big, -1, pos).to(torch.int32)


def _blocks(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return x.unflatten(2, (NK, BLOCK))[:, :, ids].flatten(2, 3)  # (B, H, n·block, D)


@pytest.mark.parametrize("top_k", [2, NK])  # sparse, and every earlier block (dense)
def test_pieces_merge_to_the_full_attention(top_k):
    x = _inputs()
    q, k, v = (x[n].clone().requires_grad_() for n in "qkv")
    spec = SparseSpec(block_size=BLOCK, top_k=top_k, local_blocks=1, sink_blocks=1)
    idx = select_blocks(q.detach(), k.detach(), spec, q_block_offset=HALF)  # (B, Hkv, HALF, budget) global ids
    want = sparse_attention_reference(q, k, v, idx, block_size=BLOCK, q_block_offset=HALF)
    want.backward(x["gout"])

    # The queries' own half (with the diagonal), then the earlier blocks in two interleaved pieces.
    pieces = [torch.arange(HALF, NK), torch.arange(0, HALF, 2), torch.arange(1, HALF, 2)]
    parts = []
    for j, ids in enumerate(pieces):
        diag = 0 if j == 0 else None
        parts.append(partial_attention_forward(x["q"], _blocks(x["k"], ids), _blocks(x["v"], ids),
                                               _restrict(idx, ids), block_size=BLOCK, diag_offset=diag))
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)  # (B, Hq, Lq)
    out = sum(torch.exp(p[1] - lse)[..., None] * p[0] for p in parts)
    torch.testing.assert_close(out, want.detach(), atol=1e-5, rtol=1e-5)
    # the same merge done inside the kernel, piece after piece (first piece without a diagonal here)
    acc = None
    for j in (1, 0, 2):
        ids = pieces[j]
        acc = partial_attention_forward(x["q"], _blocks(x["k"], ids), _blocks(x["v"], ids), _restrict(idx, ids),
                                        block_size=BLOCK, diag_offset=0 if j == 0 else None, acc=acc)
    torch.testing.assert_close(acc[0], out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acc[1], lse, atol=1e-5, rtol=1e-5)

    delta = (x["gout"] * out).sum(-1)  # (B, Hq, Lq)
    dq = torch.zeros_like(x["q"])
    dk, dv = torch.zeros_like(x["k"]), torch.zeros_like(x["v"])
    for j, ids in enumerate(pieces):
        diag = 0 if j == 0 else None
        gq, gk, gv = partial_attention_backward(x["q"], _blocks(x["k"], ids), _blocks(x["v"], ids),
                                                _restrict(idx, ids), x["gout"], lse, delta, block_size=BLOCK,
                                                diag_offset=diag)
        dq += gq
        dk.unflatten(2, (NK, BLOCK))[:, :, ids] += gk.unflatten(2, (ids.numel(), BLOCK))
        dv.unflatten(2, (NK, BLOCK))[:, :, ids] += gv.unflatten(2, (ids.numel(), BLOCK))
    for name, got, ref in (("dq", dq, q.grad), ("dk", dk, k.grad), ("dv", dv, v.grad)):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_rows_choosing_nothing_give_zero_and_minus_infinity():
    x = _inputs(1)
    ids = torch.arange(0, 4)
    idx = torch.full((B, HKV, HALF, 3), -1, dtype=torch.int32)
    idx[:, :, 0, :2] = torch.tensor([0, 2], dtype=torch.int32)  # only the first query block reads this piece
    out, lse = partial_attention_forward(x["q"], _blocks(x["k"], ids), _blocks(x["v"], ids), idx, block_size=BLOCK)
    assert torch.isneginf(lse[:, :, BLOCK:]).all() and (out[:, :, BLOCK:] == 0).all()
    assert torch.isfinite(lse[:, :, :BLOCK]).all()
    # the first query block: plain softmax over blocks 0 and 2 (no causal mask: they lie before it)
    kk = _blocks(x["k"], torch.tensor([0, 2])).repeat_interleave(HQ // HKV, dim=1)  # (B, Hq, 2·block, D)
    vv = _blocks(x["v"], torch.tensor([0, 2])).repeat_interleave(HQ // HKV, dim=1)
    s = x["q"][:, :, :BLOCK] @ kk.transpose(-1, -2) / D ** 0.5  # (B, Hq, block, 2·block)
    torch.testing.assert_close(out[:, :, :BLOCK], torch.softmax(s, -1) @ vv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[:, :, :BLOCK], torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)
