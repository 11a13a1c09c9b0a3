"""Ahead-of-time compiles of the Triton kernels for A100/H100/B200 fit their shared memory (no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lcft.errors import LcftError
from lcft.kernels.triton_tiles import SMEM_LIMIT, check_model_kernels_fit, check_sparse_kernels_fit

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.mark.triton
@pytest.mark.slow
@needs_triton
def test_worst_case_kernels_compile_within_each_targets_shared_memory(tmp_path):
    """fp32 / head_dim 128 / block 128 on sm_80, bf16 GQA 8 at head_dim 96 on sm_90, head_dim 128 on sm_100, sm_89,
    selection; and no kernel spills more than a few registers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # a real compile each time, not a cached result
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_resources.py"), "--quick", "--json",
                          str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(out.read_text())
    seen = {(r["arch"], r["kernel"]) for r in rows}
    assert {("sm_80", "fwd"), ("sm_80", "dkv"), ("sm_89", "dq"), ("sm_90", "dq"), ("sm_90", "dkv"), ("sm_100", "dkv"),
            ("sm_80", "selection")} <= seen
    for r in rows:
        limit = SMEM_LIMIT[(int(r["arch"][3:-1]), int(r["arch"][-1]))]
        assert 0 < r["shared"] <= limit, r
        assert r["spill_bytes"] is None or r["spill_bytes"] <= 1024, r  # at most a few spilled registers


@pytest.mark.triton
@needs_triton
def test_compiled_ahead_tile_choices_do_not_spill(tmp_path):
    """A fixed sample of the table's bf16, fp16 and fp32 choices where the heuristic's tiles spilled, compiled for
    their targets: each uses fewer than 255 registers and spills nothing (`make bench` compiles all 432 bf16/fp16
    kernels of sm_80/90/100 and the table's fp32 ones with `kernel_resources.py --table`, which fails on the same
    condition)."""
    from lcft.kernels.triton_tile_table import CHOSEN

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_resources.py"), "--table", "--quick",
                          "--json", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {r["dtype"] for r in rows} == {"bf16", "fp16", "fp32"} and len(rows) >= 7
    for r in rows:  # each is a table entry, so the test exercises the table, not the heuristic
        assert (int(r["arch"][3:]), r["dtype"], r["head_dim"], r["block"], r["group"]) in CHOSEN, r
        assert r["spill_bytes"] == 0 and r["regs"] is not None and r["regs"] < 255, r


def test_resource_check_is_a_no_op_off_cuda():
    check_sparse_kernels_fit(torch.device("cpu"), torch.float32, 128, 128, 1)


def test_model_check_skips_what_does_not_run_triton():
    import lcft.model as lm
    from lcft.kernels import SparseSpec

    sparse = lm.AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=96))  # no Triton tile for 96
    cfg = lm.LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, attention=sparse)
    check_model_kernels_fit(cfg, torch.device("cpu"), "fp32")  # CPU runs the PyTorch kernels
    if torch.cuda.is_available():
        with pytest.raises(LcftError, match="--block-size"):
            check_model_kernels_fit(cfg, torch.device("cuda"), "bf16")
