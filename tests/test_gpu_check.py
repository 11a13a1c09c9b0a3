"""The CPU side of benchmarks/gpu_check.py: options, lengths, the markdown table, the no-GPU exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402


def test_lengths_and_options():
    assert gpu_check.lengths("32K,1M,4096") == [32768, 1 << 20, 4096]
    args = gpu_check.parse_args(["--quick", "--out", "x", "--dense-max", "128K"])
    assert args.quick and args.out == Path("x") and gpu_check.lengths(args.dense_max) == [131072]


def test_markdown_lists_every_row():
    res = {"device": "GPU", "tests": {"summary": "9 passed"}, "attention": [
        {"length": 32768, "sparse_ms": 1.0, "dense_ms": 2.0, "sparse_tflops": 100, "dense_tflops": 300,
         "speedup": 2.0, "flop_ratio": 8.0}],
        "train": [{"length": 131072, "step_s": 3.0, "tokens_per_s": 43690, "mfu": 0.4, "peak_gib": 30.0},
                  {"length": 1 << 20, "error": "out of memory"}]}
    md = gpu_check.markdown(res)
    assert "| 32K | 1.0 | 2.0 | 100 | 300 | 2.00x | 8.00 |" in md
    assert "| 128K | 3.0 | 43690 | 40% | 30.0 |" in md and "| 1024K | out of memory |" in md


def test_without_cuda_it_exits_2_and_writes_nothing(tmp_path):
    if torch.cuda.is_available():
        return  # the real run is `make gpu-check`
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "no CUDA" in res.stderr and not (tmp_path / "o").exists()
