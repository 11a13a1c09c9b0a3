"""--precision auto by CPU capability: the detection against a timed matmul probe, the choice and its warning."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lcft.train import precision as prec
from lcft.train.config import TrainConfig
from lcft.train.trainer import train


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
