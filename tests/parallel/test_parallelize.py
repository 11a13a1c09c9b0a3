"""`parallelize` against the plain single-process model (the oracle): activation checkpointing with sequence
chunks and offload on one process, and FSDP2 over 2 gloo ranks around checkpointed, chunked blocks (FSDP's hooks
outermost, the recompute inside them): the same loss and gradients; and its documented order of compile and FSDP."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

import lcft.parallel.compile as compile_module
import lcft.parallel.fsdp as fsdp_module
from lcft.model import Llama, LlamaConfig
from lcft.parallel import ParallelConfig, ParallelizeConfig, init_parallel, single_process_state
from lcft.parallel.compile import REGIONS
from lcft.parallel.fsdp import apply_fsdp
from lcft.parallel.mesh import ParallelState
from lcft.parallel.parallelize import parallelize
from lcft.train.step import LossModel
from tests.parallel.harness import run_ranks

TOL = 1e-5


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0))


def _loss_and_grads(m: Llama, ids: torch.Tensor, root: nn.Module | None = None
                    ) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean token loss of predicting ids shifted by one, through the train step's loss model (FSDP's root)."""
    loss, count, _ = (root or LossModel(m, 0.0, 37))(ids, ids.roll(-1, 1))
    (loss / count).backward()
    grads = {}
    for n, p in m.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad  # FSDP: gather the shards
        grads[n] = g.detach().clone()
    return float((loss / count).detach()), grads


def _batch() -> torch.Tensor:
    return torch.randint(0, 16, (2, 80), generator=torch.Generator().manual_seed(1))  # (B, L)


def _max_diffs(loss: float, grads: dict, ref_loss: float, ref: dict) -> tuple[float, float]:
    assert grads.keys() == ref.keys()  # parameter names unchanged: checkpoints load either way
    return abs(loss - ref_loss), max((grads[n] - ref[n]).abs().max().item() for n in ref)


def test_checkpointing_chunks_and_offload_equal_the_plain_model():
    ref_loss, ref = _loss_and_grads(_model(), _batch())
    m = _model()
    cfg = ParallelizeConfig(checkpointing="block", offload_activations=True, seq_chunk=24)  # 80 = 3 chunks + 8
    runner = parallelize(m, single_process_state(), cfg)
    assert (m.checkpointing, m.offload, m.seq_chunk, m.offload_dtype) == ("block", True, 24, None)
    bf16 = _model()
    parallelize(bf16, single_process_state(), dataclasses.replace(cfg, offload_dtype=torch.bfloat16))
    assert bf16.offload_dtype == torch.bfloat16  # what the host copies are kept in (tests/parallel/test_activations)
    local, pos = runner.shard({"input_ids": _batch()})
    assert pos is None and torch.equal(local["input_ids"], _batch())  # one process: the plain window
    loss_diff, grad_diff = _max_diffs(*_loss_and_grads(m, _batch()), ref_loss, ref)
    assert loss_diff <= 1e-6 and grad_diff <= 1e-6


def _compiled_regions(block: nn.Module) -> list[str]:
    """Which of compile's REGIONS of `block` are torch.compile wrappers (a module's compiled call, or the
    instance attribute compile_blocks puts over a method)."""
    out = []
    for path in REGIONS:
        owner, _, name = path.rpartition(".")
        x = getattr(block.get_submodule(owner), name)
        if hasattr(x._compiled_call_impl if isinstance(x, nn.Module) else x, "_torchdynamo_orig_callable"):
            out.append(path)
    return out


def _compile_and_fsdp(layout: ParallelState) -> dict[str, Any]:
    """A fresh model parallelized with compile and FSDP: the regions each block had compiled when FSDP wrapped it,
    and each block's (FSDPModule?, compiled regions) after. Never run, so nothing is traced (no C++ compiler
    needed: its check is skipped); the order leaves the numbers alike on CPU (tracing waits for the first
    forward, when FSDP's hooks are in place either way), so the structure is what shows it."""
    m = _model()
    at_fsdp: list[list[str]] = []

    def spy(root: nn.Module, blocks: Any, *args: Any, **kw: Any) -> nn.Module:
        blocks = list(blocks)
        at_fsdp.extend(_compiled_regions(b) for b in blocks)
        return apply_fsdp(root, blocks, *args, **kw)

    # patched where it is defined: parallelize imports it when a run shards
    with (mock.patch.object(fsdp_module, "apply_fsdp", spy),
          mock.patch.object(compile_module, "check_compiler", lambda device: None)):
        parallelize(m, layout, ParallelizeConfig(checkpointing="block", compile=True), root=LossModel(m, 0.0, 37))
    return {"at_fsdp": at_fsdp, "after": [(isinstance(b, FSDPModule), _compiled_regions(b)) for b in m.layers]}


def _fsdp_rank(rank: int, world: int, offload: bool = False) -> dict[str, Any]:
    ref_loss, ref = _loss_and_grads(_model(), _batch())  # the oracle, on this process
    m = _model()
    root = LossModel(m, 0.0, 37)
    layout = init_parallel(ParallelConfig(), fsdp=True)
    parallelize(m, layout, ParallelizeConfig(checkpointing="block", offload_activations=offload, seq_chunk=24),
                root=root)
    sharded = all(isinstance(p, DTensor) for p in m.parameters())
    # every rank reads the same batch, so the ranks' mean gradient FSDP reduces is the one-process gradient
    loss_diff, grad_diff = _max_diffs(*_loss_and_grads(m, _batch(), root), ref_loss, ref)
    return {"loss_diff": loss_diff, "grad_diff": grad_diff, "sharded": sharded, "compile": _compile_and_fsdp(layout)}


def _fsdp_rank_kept_and_offloaded(rank: int, world: int) -> dict[bool, dict[str, Any]]:
    """_fsdp_rank with the block inputs kept, then offloaded (a fresh model and oracle each), on one process group."""
    return {offload: _fsdp_rank(rank, world, offload) for offload in (False, True)}


@pytest.fixture(scope="module")
def fsdp_ranks() -> dict[bool, list[dict[str, Any]]]:
    """Each rank's results of 2 gloo ranks, block inputs kept and offloaded (one spawn for both: its start-up,
    torch's imports in each rank, is most of its time)."""
    ranks = run_ranks(_fsdp_rank_kept_and_offloaded, 2)
    return {offload: [r[offload] for r in ranks] for offload in (False, True)}


@pytest.mark.distributed
@pytest.mark.parametrize("offload", [False, True], ids=["kept", "offloaded"])
def test_fsdp_around_checkpointed_chunked_blocks_equals_one_process(fsdp_ranks, offload):
    """offloaded: the block inputs' host copies, which FSDP's hooks never see (the recompute reads them)."""
    for r in fsdp_ranks[offload]:
        assert r["sharded"]
        assert r["loss_diff"] <= TOL and r["grad_diff"] <= TOL


@pytest.mark.distributed
def test_compile_comes_before_fsdp(fsdp_ranks):
    """docs/design.md (One step, one order), as torchtitan's parallelize_llama: compile (step 3) wraps each block's
    regions before FSDP2 (step 4) shards the block, so FSDP's hooks sit around the compiled regions."""
    blocks = _model().config.num_hidden_layers
    for r in fsdp_ranks[False]:
        assert r["compile"]["at_fsdp"] == [list(REGIONS)] * blocks, "compile must wrap a block before FSDP2 shards it"
        assert r["compile"]["after"] == [(True, list(REGIONS))] * blocks
