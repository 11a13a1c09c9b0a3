"""Sliding-window causal attention (Mistral, Mixtral, Qwen): each query sees the last W tokens, itself included.

Computed one query chunk at a time against only the keys its window reaches, so memory is
O(chunk · (chunk + W)) per head instead of O(L²), whatever the sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lcft.model.layers import flash_attn_for

# Queries per chunk of the masked path: the mask and the attention weights of a chunk are then
# QUERY_CHUNK x (QUERY_CHUNK + W) per head.
QUERY_CHUNK = 1024


class SlidingWindowCore(nn.Module):
    """Causal attention where query i attends to keys j with i - W < j <= i (transformers' sliding window).
    `dense` (the plain causal core) serves sequences the window covers whole."""

    def __init__(self, window: int, dense: nn.Module) -> None:
        super().__init__()
        self.window = window
        self._dense = dense

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q (B, Hq, L, D); k, v (B, Hkv, L, D) -> (B, Hq, L, D)
        n, w = q.shape[2], self.window
        if n <= w:  # the window reaches back to the first token: plain causal attention
            return self._dense(q, k, v)
        if (flash := flash_attn_for(q)) is not None:  # window_size=(left, right): keys besides the query's own
            out = flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window_size=(w - 1, 0))
            return out.transpose(1, 2)
        gqa = q.shape[1] != k.shape[1]
        outs = []
        for s in range(0, n, QUERY_CHUNK):
            e = min(n, s + QUERY_CHUNK)
            ks = max(0, s - w + 1)  # first key any query of the chunk can see
            qi = torch.arange(s, e, device=q.device)[:, None]  # (C, 1) global query positions
            kj = torch.arange(ks, e, device=q.device)[None, :]  # (1, K) global key positions
            mask = (kj <= qi) & (kj > qi - w)  # (C, K) True = attend
            outs.append(F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, ks:e], v[:, :, ks:e],
                                                       attn_mask=mask, enable_gqa=gqa))  # (B, Hq, C, D)
        return torch.cat(outs, dim=2)  # (B, Hq, L, D)
