"""Chunked cross-entropy over the LM head: never materialises the full (L x vocab) fp32 logits.

The forward pass computes logits chunk by chunk (fp32) and keeps only each token's log-sum-exp; the backward
pass recomputes one chunk of logits at a time to form its gradient. Memory beyond the inputs is
O(chunk x vocab) instead of O(L x vocab). Autocast is off inside: under it the fp32 matmuls would run in bf16
(the forward's log-sum-exp from bf16 logits, the backward's softmax from others).
"""

from __future__ import annotations

from typing import Any

import torch


def _exact(t: torch.Tensor) -> torch.autocast:
    """Autocast off on `t`'s device: every matmul here is the fp32 one it is written as."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _flatten(hidden: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} do not match")
    if weights is not None and weights.shape != labels.shape:
        raise ValueError(f"weights {tuple(weights.shape)} and labels {tuple(labels.shape)} do not match")
    h = hidden.reshape(-1, hidden.shape[-1])  # (N, H)
    y = labels.reshape(-1).long()  # (N,)
    w = None if weights is None else weights.reshape(-1).float()  # (N,)
    return h, y, w


class _ChunkedCrossEntropy(torch.autograd.Function):
    """loss_sum = Σ w (lse - logit[y]) + z_loss Σ w lse²,  z_sum = Σ w lse²,  ce_sum = Σ (lse - logit[y])
    (over counted tokens; ce_sum unweighted and not differentiable: the cross-entropy a log reports)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                chunk: int, z_loss: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with _exact(h):
            return _ChunkedCrossEntropy._forward(ctx, h, weight, y, w, chunk, z_loss)

    @staticmethod
    def _forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 chunk: int, z_loss: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = h.shape[0]
        lse = torch.zeros(n, dtype=torch.float32, device=h.device)  # (N,)
        ce_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        z_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        plain_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        wf = weight.float()  # (V, H)
        counted = w != 0  # (N,) weight 0 at ignored tokens
        for s in range(0, n, chunk):
            logits = h[s:s + chunk].float() @ wf.T  # (C, V) fp32
            lse_c = torch.logsumexp(logits, dim=-1)  # (C,)
            lse[s:s + chunk] = lse_c
            yc = y[s:s + chunk].clamp(min=0)  # ignored labels point at row 0; their weight is 0
            target = logits.gather(1, yc[:, None])[:, 0]  # (C,)
            wc, mask = w[s:s + chunk], counted[s:s + chunk]
            # where(): an ignored token must add exactly 0 even if its logits overflow
            ce_sum += torch.where(mask, wc * (lse_c - target), 0.0).sum()
            plain_sum += torch.where(y[s:s + chunk] >= 0, lse_c - target, 0.0).sum()  # weight 0 counts here too
            z_sum += torch.where(mask, wc * lse_c * lse_c, 0.0).sum()
        ctx.save_for_backward(h, weight, y, w, lse)
        ctx.chunk, ctx.z_loss = chunk, z_loss
        ctx.mark_non_differentiable(plain_sum)
        return ce_sum + z_loss * z_sum, z_sum, plain_sum

    @staticmethod
    def backward(ctx: Any, g_loss: torch.Tensor, g_z: torch.Tensor, _g_plain: torch.Tensor
                 ) -> tuple[torch.Tensor | None, ...]:
        with _exact(g_loss):
            return _ChunkedCrossEntropy._backward(ctx, g_loss, g_z)

    @staticmethod
    def _backward(ctx: Any, g_loss: torch.Tensor, g_z: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, weight, y, w, lse = ctx.saved_tensors
        chunk, z_loss = ctx.chunk, ctx.z_loss
        wf = weight.float()  # (V, H)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(wf) if ctx.needs_input_grad[1] else None
        z_coef = 2.0 * (g_loss * z_loss + g_z)  # d(w lse²)/dlogits = 2 w lse softmax
        for s in range(0, h.shape[0], chunk):
            hc = h[s:s + chunk].float()  # (C, H)
            logits = hc @ wf.T  # (C, V) recomputed
            lse_c, wc = lse[s:s + chunk], w[s:s + chunk]
            p = torch.exp(logits - lse_c[:, None])  # (C, V) softmax
            coef = wc * (g_loss + z_coef * lse_c)  # (C,)
            grad_logits = p * coef[:, None]  # (C, V)
            yc = y[s:s + chunk].clamp(min=0)
            grad_logits.scatter_add_(1, yc[:, None], (-(wc * g_loss))[:, None])
            grad_logits = torch.where((wc != 0)[:, None], grad_logits, 0.0)  # no NaN from ignored rows
            if grad_h is not None:
                grad_h[s:s + chunk] = (grad_logits @ wf).to(h.dtype)
            if grad_w is not None:
                grad_w += grad_logits.T @ hc
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, *,
                          weights: torch.Tensor | None = None, chunk: int = 8192, ignore_index: int = -100,
                          z_loss: float = 0.0, with_z: bool = False, with_ce: bool = False
                          ) -> tuple[torch.Tensor, ...]:
    """Summed token cross-entropy of `hidden @ lm_head_weight.T` against `labels`, computed chunk by chunk.

    hidden (..., L, H) any float dtype (logits are fp32 per chunk); lm_head_weight (V, H); labels (..., L)
    with `ignore_index` for tokens that carry no loss; weights (..., L) optional per-token weights.
    Returns (loss_sum, count[, z_sum][, ce_sum]): loss_sum = Σ w_i (ce_i + z_loss·lse_i²) over counted tokens,
    count = number of counted tokens (fp32 tensor), z_sum = Σ w_i lse_i² (PaLM's z-loss term), ce_sum = Σ ce_i
    (unweighted, no z-loss, not differentiable: the model's cross-entropy whatever the weights, for logging).
    Zero counted tokens give loss 0 and zero (finite) gradients; divide by max(count, 1) for a mean.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    h, y, w = _flatten(hidden, labels, weights)
    counted = y != ignore_index  # (N,)
    w = counted.float() if w is None else torch.where(counted, w, 0.0)  # (N,)
    loss_sum, z_sum, ce_sum = _ChunkedCrossEntropy.apply(h, lm_head_weight, torch.where(counted, y, -1), w, chunk,
                                                         float(z_loss))
    count = counted.sum().float()
    return (loss_sum, count, *([z_sum] if with_z else []), *([ce_sum] if with_ce else []))


def per_token_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, *,
                   chunk: int = 8192, ignore_index: int = -100) -> torch.Tensor:
    """Cross-entropy of each token (..., L) in fp32 (nats), 0 where the label is ignored; chunked like
    chunked_cross_entropy (for evaluation; differentiable but meant for no_grad use)."""
    h, y, _ = _flatten(hidden, labels, None)
    wf = lm_head_weight.float()  # (V, H)
    out = []
    with _exact(h):
        for s in range(0, h.shape[0], chunk):
            logits = h[s:s + chunk].float() @ wf.T  # (C, V) fp32
            yc = y[s:s + chunk]
            keep = yc != ignore_index
            ce = torch.logsumexp(logits, -1) - logits.gather(1, yc.clamp(min=0)[:, None])[:, 0]  # (C,)
            out.append(torch.where(keep, ce, 0.0))
    flat = torch.cat(out) if out else h.new_zeros(0, dtype=torch.float32)
    return flat.reshape(labels.shape)
