"""Functions run on each spawned rank by the distributed tests (module-level so spawn can pickle them)."""

from __future__ import annotations

from typing import Any

import torch

from lcft.model.config import AttentionConfig
from lcft.parallel import ContextParallelCore, ParallelConfig, ShardLayout, comms, init_parallel


def attention_cases(rank: int, world: int, cases: list[dict], full: dict[str, torch.Tensor],
                    attn: dict[str, Any]) -> list[dict]:
    """Each case: one CP attention layer forward + backward on this rank's shard of the full q, k, v."""
    out = []
    for case in cases:
        pcfg = ParallelConfig(cp=world, cp_layout=case["layout"], cp_kv=case["kv"])
        state = init_parallel(pcfg)
        core = ContextParallelCore(AttentionConfig(backend=case["backend"], **attn), state, pcfg)
        layout = ShardLayout(full["q"].shape[2], world, attn["block_size"], case["layout"])
        q, k, v = (layout.shard(full[n], rank, dim=2).clone().requires_grad_() for n in "qkv")
        comms.STATS.reset()
        o = core(q, k, v)  # (B, Hq, L/cp, D)
        o.backward(layout.shard(full["gout"], rank, dim=2))
        out.append({"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
                    "bytes": comms.STATS.snapshot()})
    return out
