"""Mixtral's sparse mixture-of-experts MLP: softmax router, top-k experts per token, renormalised weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lcft.model.layers import MLP


class MoE(nn.Module):
    """Each token goes through its top-k SwiGLU experts, their outputs weighted by the router's softmax
    probabilities renormalised over the chosen k (transformers' MixtralSparseMoeBlock, op for op).

    Tokens are sorted by expert so that each expert runs one matmul over a contiguous slice."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden_size, intermediate_size, fused=False) for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, H) -> (router probabilities (N, E) fp32, chosen experts (N, k), their weights (N, k) fp32)."""
        probs = F.softmax(self.gate(x).float(), dim=-1)  # (N, E)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # (N, k) each
        return probs, experts, weights / weights.sum(dim=-1, keepdim=True)

    def forward(self, x: torch.Tensor, with_stats: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, L, H) -> (out (B, L, H), router statistics (2, E) fp32 or None).

        The statistics are what the load-balancing loss needs from this block: row 0 the router probabilities
        summed over the tokens (differentiable), row 1 how often each expert was chosen (a count)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, H)
        probs, experts, weights = self.route(flat)
        order = experts.reshape(-1).argsort(stable=True)  # (N·k,) assignments sorted by expert
        counts = torch.bincount(experts.reshape(-1), minlength=self.num_experts)  # (E,)
        token = order // self.top_k  # (N·k,) token of each sorted assignment
        scale = weights.reshape(-1)[order]  # (N·k,) fp32
        out = torch.zeros_like(flat)  # (N, H)
        start = 0
        for e, n in enumerate(counts.tolist()):
            # An expert no token chose still runs (on 0 rows): its weights then get a zero gradient rather than
            # none, which DDP needs when another rank's tokens did choose it.
            rows = token[start:start + n]  # (n,)
            y = self.experts[e](flat[rows]) * scale[start:start + n, None]  # (n, H) fp32
            out.index_add_(0, rows, y.to(out.dtype))
            start += n
        stats = torch.stack([probs.sum(0), counts.to(probs.dtype)]) if with_stats else None  # (2, E)
        return out.view(shape), stats


def load_balancing_loss(stats: torch.Tensor, rows: int, num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss as transformers' load_balancing_loss_func computes it over all layers:
    E · Σ_e (chosen_e / R) · (prob_e / R), with stats (2, E) summed over the layers and R = tokens x layers."""
    return num_experts * (stats[1] / rows * (stats[0] / rows)).sum()
