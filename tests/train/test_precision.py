"""--precision auto by CPU capability: the detection against a timed matmul probe, the choice and its warning."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lcft.config import ConfigError
from lcft.train import precision as prec
from lcft.train.config import TrainConfig
from lcft.train.trainer import train
from tests.one_line import one_line


def _matmul_seconds(dtype: torch.dtype, n: int = 512) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)  # (n, n) each
    a @ b  # warm-up
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


def test_detection_agrees_with_a_timed_probe() -> None:
    """The oracle is the hardware itself: emulated bf16 is tens to hundreds of times slower than fp32 (measured
    66x-500x on AVX2-only EPYC), native bf16 is at least as fast as fp32 (AMX ~3x)."""
    ratio = _matmul_seconds(torch.bfloat16) / _matmul_seconds(torch.float32)
    if prec.cpu_has_native_bf16():
        assert ratio < 2.0, f"reported native bf16 but bf16 matmul is {ratio:.1f}x slower than fp32"
    else:
        assert ratio > 4.0, f"reported no native bf16 but bf16 matmul is only {ratio:.1f}x slower than fp32"


def test_choice_follows_the_capability() -> None:
    native = prec.cpu_has_native_bf16()
    assert prec.choose_precision("auto", cpu=True) == ("bf16" if native else "fp32", None)
    assert prec.choose_precision("fp32", cpu=True) == ("fp32", None)
    assert prec.choose_precision("auto", cpu=False) == ("bf16", None)
    assert prec.choose_precision("bf16", cpu=False) == ("bf16", None)
    chosen, warning = prec.choose_precision("bf16", cpu=True)
    assert chosen == "bf16"  # an explicit choice is honoured
    assert (warning is None) == native
    assert prec.bench_dtype() == prec.choose_precision("auto", cpu=not torch.cuda.is_available())[0]
    assert ("no native bf16" in prec.cpu_describe()) != native


@pytest.mark.parametrize("flags, native", [({"fpu", "avx2", "fma"}, False), ({"avx2", "avx512f"}, False),
                                           ({"avx512f", "avx512_bf16"}, True), ({"amx_tile", "amx_bf16"}, True),
                                           ({"fp", "asimd", "bf16"}, True)])
def test_feature_flags(monkeypatch: pytest.MonkeyPatch, flags: set[str], native: bool) -> None:
    """The /proc/cpuinfo path, for CPUs this machine is not (PyTorch's own checks report nothing)."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(prec, "_cpuinfo_flags", lambda: flags)
    prec.cpu_has_native_bf16.cache_clear()
    try:
        assert prec.cpu_has_native_bf16() is native
        assert prec.choose_precision("auto", cpu=True)[0] == ("bf16" if native else "fp32")
        assert (prec.choose_precision("bf16", cpu=True)[1] is None) is native
    finally:
        prec.cpu_has_native_bf16.cache_clear()


def test_trainer_runs_the_chosen_precision(base_cfg: dict[str, Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A real CPU run with --precision auto reports the capability's choice and prints no warning."""
    cfg = TrainConfig(**{**base_cfg, "precision": "auto", "steps": 1, "global_batch": 1, "out": str(tmp_path / "r")})
    summary = train(cfg)
    assert summary["precision"] == ("bf16" if prec.cpu_has_native_bf16() else "fp32")
    assert "warning" not in capsys.readouterr().out


@pytest.mark.skipif(prec.cpu_has_native_bf16(), reason="this CPU has native bf16: no warning to show")
def test_explicit_bf16_warns(base_cfg: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = TrainConfig(**{**base_cfg, "precision": "bf16", "seq_len": 64, "steps": 1, "global_batch": 1,
                         "out": str(tmp_path / "r")})
    summary = train(cfg)
    assert summary["precision"] == "bf16"
    out = capsys.readouterr().out
    assert "--precision bf16 on a CPU without native bf16" in out


def test_bf16_host_copies_need_a_bf16_run(base_cfg: dict[str, Any], tmp_path: Path) -> None:
    """--offload-bf16 rounds the block inputs of a run computing in bf16; an fp32 run is refused before anything
    is written, and it needs --offload-activations at all."""
    assert prec.offload_dtype(False, "fp32") is None and prec.offload_dtype(False, "bf16") is None
    assert prec.offload_dtype(True, "bf16") == torch.bfloat16
    one_line(lambda: prec.offload_dtype(True, "fp32"), "--offload-bf16 needs bf16 precision")
    out = tmp_path / "r"
    cfg = TrainConfig(**{**base_cfg, "checkpointing": "block", "offload_activations": True, "offload_bf16": True,
                         "steps": 1, "global_batch": 1, "out": str(out)})
    one_line(lambda: train(cfg), "--offload-bf16 needs bf16 precision")
    assert not out.exists()
    one_line(lambda: TrainConfig(**{**base_cfg, "checkpointing": "block", "offload_bf16": True}),
             "offload_bf16 needs offload_activations", error=ConfigError)


def test_a_bf16_run_keeps_its_offloaded_inputs_in_bf16(base_cfg: dict[str, Any], tmp_path: Path) -> None:
    """Oracle: the same run with exact host copies. The forward runs on each block's input itself, so the first
    step's loss (taken before any update) is the same to the bit; the gradients see the rounded copies, so the
    second step's is not."""
    base = {**base_cfg, "precision": "bf16", "seq_len": 64, "steps": 2, "global_batch": 1, "checkpointing": "block",
            "offload_activations": True}
    runs = {}
    for name, bf16 in (("exact", False), ("bf16", True)):
        out = tmp_path / name
        assert train(TrainConfig(**{**base, "offload_bf16": bf16, "out": str(out)}))["precision"] == "bf16"
        runs[name] = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
                      if '"loss"' in line]
    assert len(runs["exact"]) == 2 and runs["bf16"][0] == runs["exact"][0], runs
    assert runs["bf16"][1] != runs["exact"][1], runs
