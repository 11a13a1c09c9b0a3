"""The position-free parts of a block: RMSNorm and the SwiGLU MLP (HF Llama's math, op for op)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _RMSNormFunction(torch.autograd.Function):
    """HF's RMSNorm math, but backward recomputes the normalised input from x and the per-token rstd instead
    of keeping it: one (L, H) tensor less saved per norm (autograd would keep both x and x·rstd)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()  # (..., H)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd  # (..., H) fp32, recomputed
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad.float() * normed.to(x.dtype).float()).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        grad_n = grad.float() * weight.float()  # (..., H)
        grad_x = rstd * (grad_n - normed * (grad_n * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain; statistics in fp32 whatever the input dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)  # (..., H)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, fused: bool = True) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            # gate and up in one matmul (separate parameters, HF names): one pass over x forward and backward,
            # for the price of a (2I, H) weight copy kept for backward (not worth it for MoE's many experts)
            w = torch.cat([self.gate_proj.weight, self.up_proj.weight])  # (2I, H)
            gate, up = F.linear(x, w).chunk(2, dim=-1)  # (..., I) each
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)  # (..., I) each
        return self.down_proj(F.silu(gate) * up)  # (..., H)


@functools.cache
def flash_attn_func() -> Callable | None:
    """flash-attn's function when the package is installed (imported lazily, only for CUDA tensors)."""
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func


def flash_attn_for(q: torch.Tensor) -> Callable | None:
    """flash-attn's function where it may run on `q`: a CUDA tensor in half precision, the package installed."""
    return flash_attn_func() if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else None
