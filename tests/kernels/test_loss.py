"""Chunked cross-entropy and per-token loss against F.cross_entropy on the full logits (the oracle)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lcft.kernels import chunked_cross_entropy, per_token_loss


def make(seed: int = 0, n: int = 300, h: int = 24, v: int = 16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, n, h, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).requires_grad_()
    labels = torch.randint(0, v, (2, n), generator=g)
    labels[torch.rand(2, n, generator=g) < 0.3] = -100  # N positions carry no loss
    weights = torch.where(torch.rand(2, n, generator=g) < 0.5, 0.1, 1.0)  # soft-masked repeats
    return hidden, weight, labels, weights


def oracle(hidden, weight, labels, weights=None, z_loss=0.0):
    logits = hidden.float() @ weight.float().T  # (B, L, V) full fp32 logits
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none",
                         ignore_index=-100)
    keep = labels.reshape(-1) != -100
    w = torch.ones_like(ce) if weights is None else weights.reshape(-1)
    lse = torch.logsumexp(logits.reshape(-1, logits.shape[-1]), -1)
    loss = (w * (ce + z_loss * lse**2))[keep].sum()
    return loss, keep.sum().float(), (w * lse**2)[keep].sum()


def grads(loss, *ts):
    return torch.autograd.grad(loss, ts)


def assert_grads_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """rtol 1e-5 relative to the gradient's scale: entries near 0 are sums with fp32 cancellation, and the
    weight gradient sums over tokens in a different order (per chunk) than the full-logits oracle."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("use_weights", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("chunk", [7, 64, 8192])
def test_value_and_grads_match_full_cross_entropy(chunk, use_weights):
    hidden, weight, labels, weights = make()
    w = weights if use_weights else None
    loss, count = chunked_cross_entropy(hidden, weight, labels, weights=w, chunk=chunk)
    ref, ref_count, _ = oracle(hidden, weight, labels, w)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=0)
    assert count.item() == ref_count.item() == (labels != -100).sum().item()
    for a, b in zip(grads(loss, hidden, weight), grads(ref, hidden, weight), strict=True):
        assert_grads_close(a, b)


def test_z_loss_matches_direct_formula():
    hidden, weight, labels, weights = make(1)
    loss, count, z = chunked_cross_entropy(hidden, weight, labels, weights=weights, chunk=50, z_loss=1e-2,
                                           with_z=True)
    ref, _, ref_z = oracle(hidden, weight, labels, weights, z_loss=1e-2)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=0)
    # gradients of a combination of both outputs (the z_sum output is differentiable too)
    ga = grads(loss + 0.5 * z, hidden, weight)
    gb = grads(ref + 0.5 * ref_z, hidden, weight)
    for a, b in zip(ga, gb, strict=True):
        assert_grads_close(a, b)


def test_zero_counted_tokens_give_zero_loss_and_finite_grads():
    hidden, weight, labels, _ = make(2)
    labels = torch.full_like(labels, -100)  # an all-N window
    loss, count, z = chunked_cross_entropy(hidden, weight, labels, chunk=64, z_loss=1e-4, with_z=True)
    assert loss.item() == 0.0 and count.item() == 0.0 and z.item() == 0.0
    gh, gw = grads(loss, hidden, weight)
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()
    assert gh.abs().max() == 0 and gw.abs().max() == 0
    mean = loss / count.clamp(min=1)  # how the trainer averages: still 0, not NaN
    assert mean.item() == 0.0


def test_bf16_hidden_gives_fp32_loss_close_to_fp32():
    hidden, weight, labels, weights = make(3, dtype=torch.bfloat16)
    loss, _ = chunked_cross_entropy(hidden, weight, labels, weights=weights, chunk=64)
    ref, _, _ = oracle(hidden.detach().float(), weight, labels, weights)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=0)
    (gh,) = grads(loss, hidden)
    assert gh.dtype == torch.bfloat16 and torch.isfinite(gh.float()).all()


def test_never_materialises_full_logits():
    """Peak extra memory of forward + backward stays O(chunk x vocab), far below the L x vocab logits."""
    n, h, v, chunk = 4096, 16, 2048, 256
    hidden = torch.randn(1, n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    labels = torch.randint(0, v, (1, n))
    biggest = []

    def pack(t):
        biggest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = chunked_cross_entropy(hidden, weight, labels, chunk=chunk)
    loss.backward()
    assert max(biggest) < n * v // 4  # only inputs and per-token lse are saved, never (L, V) logits


def test_per_token_loss_matches_cross_entropy():
    hidden, weight, labels, _ = make(4)
    with torch.no_grad():
        got = per_token_loss(hidden, weight, labels, chunk=33)
        logits = hidden @ weight.T
        want = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)
    assert got.shape == labels.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got[labels == -100] == 0).all() and torch.isfinite(got).all()


def test_autocast_leaves_the_fp32_logits_fp32():
    """Called under bf16 autocast (lcft eval --precision bf16, a benchmark's step), loss, gradients and per-token
    losses are still the fp32 ones: autocast would run the chunks' matmuls in bf16."""
    hidden, weight, labels, weights = make(5)
    ref, _, _ = oracle(hidden, weight, labels, weights)
    want = grads(ref, hidden, weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = chunked_cross_entropy(hidden, weight, labels, weights=weights, chunk=64)
        got = grads(loss, hidden, weight)
        per_token = per_token_loss(hidden.detach(), weight.detach(), labels, chunk=64)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=0)
    for a, b in zip(got, want, strict=True):
        assert_grads_close(a, b)
    with torch.no_grad():
        plain = per_token_loss(hidden, weight, labels, chunk=64)
    torch.testing.assert_close(per_token, plain, rtol=1e-6, atol=1e-6)
