"""Functions run on each spawned rank by the distributed tests (module-level so spawn can pickle them)."""

from __future__ import annotations

from typing import Any

import torch

from lcft.model.config import AttentionConfig
from lcft.parallel import ContextParallelCore, ParallelConfig, ShardLayout, comms, init_parallel
from lcft.parallel.activations import apply_activation_checkpointing


def attention_cases(rank: int, world: int, cases: list[dict], full: dict[str, torch.Tensor],
                    attn: dict[str, Any]) -> list[dict]:
    """Each case: one CP attention layer forward + backward on this rank's shard of the full q, k, v."""
    out = []
    for case in cases:
        pcfg = ParallelConfig(cp=world, cp_layout=case["layout"], cp_kv=case["kv"])
        state = init_parallel(pcfg)
        core = ContextParallelCore(AttentionConfig.from_dict(dict(attn, backend=case["backend"])), state, pcfg)
        layout = ShardLayout(full["q"].shape[2], world, attn["block_size"], case["layout"])
        q, k, v = (layout.shard(full[n], rank, dim=2).clone().requires_grad_() for n in "qkv")
        comms.STATS.reset()
        o = core(q, k, v)  # (B, Hq, L/cp, D)
        o.backward(layout.shard(full["gout"], rank, dim=2))
        out.append({"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
                    "bytes": comms.STATS.snapshot()})
    return out


def tiny_model(backend: str, seed: int = 0):
    """The tiny preset with small sparse blocks, so a short window has real (cross-shard) sparsity."""
    from lcft.model import Llama, preset

    cfg = preset("tiny")
    cfg.attention = AttentionConfig.from_dict({"backend": backend, "block_size": 16, "top_k": 2, "local_blocks": 1,
                                               "sink_blocks": 1, "impl": "cpu"})
    torch.manual_seed(seed)
    return Llama(cfg)


def trainer_step(model: torch.nn.Module, runner, batch: dict[str, torch.Tensor]) -> float:
    """One step's forward and backward as the trainer takes it (lcft.train.global_step): the DDP-wrapped LossModel
    through compute_loss (which shards under cp), backward of the loss sum x the global batch's Normaliser scale;
    returns the reported loss (the world's loss sum per counted token). DDP averages gradients over the ranks."""
    import numpy as np
    from torch.nn.parallel import DistributedDataParallel

    from lcft.genomics.dataset import batch_counts
    from lcft.train.global_step import Normaliser, world_sum
    from lcft.train.step import LossModel, compute_loss

    ddp = DistributedDataParallel(LossModel(model, z_loss=0.0, chunk=96))  # held: its reducer syncs in backward
    bases = np.ones(model.config.vocab_size, dtype=np.int64)  # one base per token (char vocabulary)
    norm = Normaliser.of(batch_counts([batch], bases), runner.state.cp, runner.state.world, accum=1)
    loss_sum, _, _ = compute_loss(ddp, batch, runner)
    (loss_sum * norm.scale).backward()
    return norm.per_token(world_sum([loss_sum.item()])[0])


def train_steps(rank: int, world: int, cases: list[tuple[str, str, str, str]], batch: dict[str, torch.Tensor]
                ) -> list[dict[str, Any]]:
    """Per case (backend, layout, kv, activation checkpointing): one forward/backward of the tiny model under
    cp=world through the trainer's loss path (`trainer_step`)."""
    from lcft.parallel import ContextParallelRunner, apply_context_parallel

    out = []
    for backend, layout, kv, checkpointing in cases:
        pcfg = ParallelConfig(cp=world, cp_layout=layout, cp_kv=kv)
        state = init_parallel(pcfg)
        model = apply_context_parallel(tiny_model(backend), state, pcfg)
        # 'block' re-runs the K/V collectives in backward; 'offload' too, from the block inputs' host copies
        apply_activation_checkpointing(model, "block" if checkpointing == "offload" else checkpointing,
                                       offload=checkpointing == "offload")
        runner = ContextParallelRunner(state, pcfg, model.config.attention.sparse.block_size)
        comms.STATS.reset()
        loss = trainer_step(model, runner, batch)
        out.append({"loss": loss, "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                    "calls": dict(comms.STATS.calls)})
    return out


def largest_kv_like_tensor(rank: int, world: int, modes: list[str], full: dict[str, torch.Tensor],
                           attn: dict[str, Any]) -> dict[str, int]:
    """Per cp_kv mode: the most elements of any tensor with the head dim last that one CP attention layer's
    forward + backward creates on this rank (a dispatch mode sees every op, comms buffers included)."""
    from tests.probes import LargestTensor

    d = full["q"].shape[-1]

    result = {}
    for mode in modes:
        pcfg = ParallelConfig(cp=world, cp_layout="zigzag", cp_kv=mode)
        core = ContextParallelCore(AttentionConfig.from_dict(dict(attn, backend="sparse")), init_parallel(pcfg), pcfg)
        layout = ShardLayout(full["q"].shape[2], world, attn["block_size"], "zigzag")
        q, k, v = (layout.shard(full[n], rank, dim=2).clone().requires_grad_() for n in "qkv")
        gout = layout.shard(full["gout"], rank, dim=2)
        with LargestTensor(keep=lambda t: t.dim() >= 2 and t.shape[-1] == d) as seen:
            core(q, k, v).backward(gout)
        result[mode] = seen.numel
    return result


def join_restarted(rank: int, world: int, counts: list[int]) -> tuple[int, dict[int, int], int]:
    """Join a launch's group as a worker whose elastic agent counted counts[rank] restarts (lcft.parallel.mesh
    init_world); returns the restarts liveness says the group is at, whom its heartbeat knew at once (rank: pid),
    and this process's pid."""
    import os

    from lcft import liveness
    from lcft.parallel.mesh import init_world

    os.environ.update(TORCHELASTIC_RUN_ID="restarted", TORCHELASTIC_USE_AGENT_STORE="False",
                      TORCHELASTIC_RESTART_COUNT=str(counts[rank]))
    init_world(collective_timeout=30.0)
    try:
        peers = {r: p.pid for r, p in liveness._current.peers.items()}  # read before init_world returned
        return liveness.restarts(), peers, os.getpid()
    finally:
        liveness.stop()


def step_max(rank: int, world: int, values: list[int]) -> tuple[list[int], dict[str, int], dict[str, int]]:
    """The trainer's max over the ranks (peak memory, the signal agreed on) of `values` shifted by the rank, with
    the collectives comms.STATS counted for it."""
    from lcft.train.global_step import GlobalStep

    step = object.__new__(GlobalStep)  # (only `world` is read by its collectives)
    step.world = world
    comms.STATS.reset()
    got = step._max([v + (rank if i % 2 else -rank) for i, v in enumerate(values)])
    return got, dict(comms.STATS.calls), dict(comms.STATS.bytes)


def same_run_check(rank: int, world: int, versions: list[str]) -> str | None:
    """check_same_run on each rank as node `rank`, its fingerprint made by an lcft whose version reads
    versions[rank] (the input faked, the comparison real); the error the rank raised, or None."""
    import os
    from unittest import mock

    from lcft.errors import LcftError
    from lcft.liveness import NODE_RANK_ENV
    from lcft.parallel import same_run

    os.environ[NODE_RANK_ENV] = str(rank)
    with mock.patch.object(same_run, "__version__", versions[rank]):
        fields = same_run.fingerprint({"lr": 0.001, "node_rank": rank}, {"data": "9f86d081884c7d65"})
    try:
        same_run.check_same_run(fields)
    except LcftError as e:
        return str(e)
    return None



def train_same_run_checks(rank: int, world: int, cases: list[list[dict[str, Any]]]) -> list[str | None]:
    """For each case, lcft.train.run_dir.same_run of TrainConfig(**case[rank]) on each rank, as node `rank`,
    compared over the group (check_same_run): the error each case raised on this rank, or None."""
    import os

    from lcft.errors import LcftError
    from lcft.liveness import NODE_RANK_ENV
    from lcft.parallel.same_run import check_same_run
    from lcft.train import TrainConfig
    from lcft.train.config import resolve_folders
    from lcft.train.run_dir import same_run

    os.environ[NODE_RANK_ENV] = str(rank)
    said: list[str | None] = []
    for case in cases:
        try:
            check_same_run(same_run(resolve_folders(TrainConfig(**case[rank]))))
            said.append(None)
        except LcftError as e:
            said.append(str(e))
    return said


def eval_same_run_checks(rank: int, world: int, cases: list[list[dict[str, Any]]]) -> list[str | None]:
    """As train_same_run_checks, for an evaluation's fingerprint (lcft.evaluate.runner._same_run) of
    EvalConfig(**case[rank]), its split opened and its device chosen as the evaluation does."""
    import os

    from lcft.errors import LcftError
    from lcft.evaluate.config import EvalConfig
    from lcft.evaluate.inputs import open_split
    from lcft.evaluate.runner import _device, _same_run
    from lcft.liveness import NODE_RANK_ENV
    from lcft.parallel.same_run import check_same_run

    os.environ[NODE_RANK_ENV] = str(rank)
    said: list[str | None] = []
    for case in cases:
        cfg = EvalConfig(**case[rank])
        ws = open_split(cfg)
        try:
            check_same_run(_same_run(cfg, ws, cfg.windows_of(len(ws)), _device(cfg.device)))
            said.append(None)
        except LcftError as e:
            said.append(str(e))
    return said
