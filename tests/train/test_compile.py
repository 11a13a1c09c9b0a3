"""--compile: regional torch.compile of the blocks gives eager's numbers (losses and weights within 1e-5) in real
training runs, with block checkpointing, with seq_chunk, under context parallelism (cp=2) with FSDP2 over its 2 ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lcft.checkpoint.reader import load
from lcft.errors import LcftError
from lcft.launch import run
from lcft.model import Llama
from lcft.parallel.activations import apply_activation_checkpointing
from lcft.parallel.compile import compile_blocks
from lcft.train.config import TrainConfig
from lcft.train.step import LossModel
from tests.train.conftest import _base, small_model_config

TOL = 1e-5
pytestmark = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")),
                                reason="inductor on CPU needs a C++ compiler")


def _run(base: dict[str, Any], out: Path, **changes: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    s = run("train", TrainConfig(**{**base, "steps": 3, "out": str(out), **changes}))
    losses = [json.loads(line)["loss"] for line in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    weights = load(s["checkpoint"]).model.state_dict()  # safetensors or a sharded (DCP) checkpoint
    assert weights
    return losses, weights


def _assert_same(eager: tuple, compiled: tuple) -> None:
    (le, we), (lc, wc) = eager, compiled
    assert len(le) == len(lc) == 3
    for a, b in zip(le, lc, strict=True):
        assert abs(a - b) <= TOL * max(1.0, abs(a)), (le, lc)
    assert we.keys() == wc.keys()  # compiling keeps parameter names: checkpoints load either way
    for k in we:
        assert torch.allclose(we[k], wc[k], atol=TOL, rtol=0), k


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, init_dir: Path) -> tuple:
    """The eager run in this process, no checkpointing: the oracle of the compiled one-process and two-rank runs."""
    return _run(_base(data_dir, init_dir), tmp_path_factory.mktemp("eager") / "run", checkpointing="none")


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["none", "block"])
def test_compiled_run_equals_eager(base_cfg: dict[str, Any], tmp_path: Path, eager_run: tuple,
                                   checkpointing: str) -> None:
    eager = eager_run if checkpointing == "none" else _run(base_cfg, tmp_path / "eager", checkpointing=checkpointing)
    compiled = _run(base_cfg, tmp_path / "compiled", checkpointing=checkpointing, compile=True)
    _assert_same(eager, compiled)


@pytest.mark.slow
def test_compiled_run_equals_eager_on_two_ranks(base_cfg: dict[str, Any], tmp_path: Path, eager_run: tuple) -> None:
    """Two processes as dp 1 x cp 2 with FSDP2 over both (accumulation 2 on each rank): the context-parallel core
    and its collectives stay eager between the compiled regions, and FSDP2's per-block hooks sit around them.
    The oracle is the one-process eager run, which computes the same batches (2 micro-batches of 1 on one rank):
    an eager two-rank launch was within 2e-7 of it, 50x inside TOL, and cost a launch of its own (3 processes);
    this eager layout itself is held to one process by tests/parallel/test_fsdp.py (fsdp_cp2 against init_one)."""
    compiled = _run(base_cfg, tmp_path / "compiled", compile=True, nproc=2, cp=2, shard="fsdp", global_batch=2)
    _assert_same(eager_run, compiled)


@pytest.mark.slow
@pytest.mark.parametrize("seq_chunk,offload", [(512, False), (512, True), (0, True)])
def test_compiled_seq_chunk_gradients_equal_eager(seq_chunk: int, offload: bool) -> None:
    """Block checkpointing with seq_chunk (the chunked path through Block.qkv/tail) plus a last shorter chunk,
    and with the block inputs offloaded, chunked or whole (the recompute's input then is the host copy, which
    must be traced as the forward's input was): loss and every gradient as eager's. The lengths are those the
    runs above compiled (512 tokens; 256 on each cp rank), so inductor's cache has their kernels."""
    torch.manual_seed(0)
    eager = Llama(small_model_config())
    compiled = Llama(small_model_config())
    compiled.load_state_dict(eager.state_dict())
    for m in (eager, compiled):
        apply_activation_checkpointing(m, "block", offload=offload, seq_chunk=seq_chunk)
    assert compile_blocks(compiled, torch.device("cpu")) == 2
    ids = torch.randint(4, 8, (1, 768 if seq_chunk else 512))  # (1, L): chunks of 512 and 256 tokens, or the whole
    grads = []
    for m in (eager, compiled):
        loss, _, _ = LossModel(m, 1e-4, 256)(ids, ids)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (le, ge), (lc, gc) = grads
    assert torch.allclose(le, lc, rtol=TOL, atol=0)
    for n in ge:
        assert torch.allclose(ge[n], gc[n], rtol=1e-4, atol=TOL), n


def test_no_cpu_compiler_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without g++/clang++ on PATH, --compile on CPU refuses before compiling anything (nothing is changed)."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    model = Llama(small_model_config())
    with pytest.raises(LcftError, match="C\\+\\+ compiler") as e:
        compile_blocks(model, torch.device("cpu"))
    assert "\n" not in str(e.value)
    assert "qkv" not in vars(model.layers[0].attn)  # the blocks were left eager


def test_a_model_without_blocks_is_a_bug_not_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model the commands build is an lcft Llama: anything else reaching compile_blocks is a caller's bug."""
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)  # a compiler, whether or not one is here
    with pytest.raises(ValueError, match="needs an lcft Llama model") as e:
        compile_blocks(torch.nn.Linear(2, 2), torch.device("cpu"))
    assert not isinstance(e.value, LcftError)
