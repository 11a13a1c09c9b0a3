"""The position-free parts of a block: RMSNorm and the SwiGLU MLP (HF Llama's math, op for op)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain; statistics in fp32 whatever the input dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()  # (..., H)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate and up in one matmul (separate parameters, HF names): one pass over x forward and backward
        w = torch.cat([self.gate_proj.weight, self.up_proj.weight])  # (2I, H)
        gate, up = F.linear(x, w).chunk(2, dim=-1)  # (B, L, I) each
        return self.down_proj(F.silu(gate) * up)  # (B, L, H)
