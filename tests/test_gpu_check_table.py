"""gpu_check's table (benchmarks/gpu_check_table.py): one markdown table, each row read against its target."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.test_gpu_check import H200_NODE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_check_plan  # noqa: E402


def test_markdown_is_one_table_with_every_row_and_the_targets():
    res = {"device": "GPU", "torch": "2.x", "attention": [
        {"length": 32768, "dense": "SDPA flash", "finite": True, "sparse_ms": 1.0, "dense_ms": 2.0,
         "sparse_tflops": 100, "dense_tflops": 300, "flop_ratio": 8.0},
        {"length": 131072, "dense": "SDPA flash", "finite": True, "sparse_ms": 3.0, "dense_ms": 30.0,
         "sparse_tflops": 200, "dense_tflops": 350, "flop_ratio": 30.0}],
        "train": [{"length": 131072, "step_s": 3.0, "tokens_per_s": 43690, "mfu": 0.4, "peak_gib": 30.0,
                   "finite": True}],
        "plan": {"length": 1 << 20, "flags": "--checkpointing block", "plan_gib": 60.0, "gpu_gib": 139.8,
                 "fits": True, "step_s": 40.0, "peak_gib": 66.0, "finite": True, "host_gib": 88.0,
                 "host_peak_gib": 90.5, "gpu_memory": "141 GB"},
        "tests": {"ok": False, "summary": "1 failed, 1 passed", "seconds": 60.0, "cases": [
            {"name": "tests.gpu.a::test_x", "outcome": "passed"}, {"name": "tests.gpu.a::test_y",
                                                                  "outcome": "failed"}]}}
    md = gpu_check.markdown(res)
    rows = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(rows) == 2 + 2 + 1 + 1 + 1 + 2 and all(r.count("|") == 7 for r in rows)  # one table
    assert "| sparse attention f+b (Triton, bf16, block selection included) | 32K | 100 TFLOP/s, 1.0 ms | SDPA flash: 300 TFLOP/s, 2.0 ms; sparse = 33% |  |  |" in md
    assert "| 128K | 200 TFLOP/s, 3.0 ms | SDPA flash: 350 TFLOP/s, 30.0 ms; sparse = 57% | >= 50% of flash | yes |" in md
    assert "43,690 tokens/s, MFU 40%, peak 30.0 GiB" in md and "| >= 35% MFU | yes |" in md
    assert "fits: peak 66.0 GiB of 139.8 GiB, host peak 90.5 GiB, 40.0 s/step" in md
    assert "| plan 60.0 GiB (+ 88.0 GiB host + 4 for the process) |" in md and "| fits one 141 GB GPU | yes |" in md
    assert "| 2 tests | 1 failed, 1 passed | 60 s | all pass | NO |" in md and "| tests.gpu.a::test_y | | failed |" in md


def test_running_out_of_memory_is_the_row_that_says_does_not_fit(monkeypatch):
    """The plan's step out of memory: "does not fit: out of memory: ..." (the table prints the error as it is)."""
    def oom(*args: object, **kwargs: object) -> dict:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(gpu_check_plan, "bench_train", oom)
    row = gpu_check_plan.bench_plan(1024, H200_NODE, "cpu", "tiny", str(gpu_check_plan.offload_budget(1024, "tiny")))
    assert not row["fits"] and row["error"] == "does not fit: out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"
    md = gpu_check.markdown({"device": "GPU", "attention": [], "train": [], "plan": row, "tests": {}})
    assert f"| {row['error']} | plan " in md
