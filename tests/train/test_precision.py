"""--precision auto by CPU capability: the detection against oneDNN's own report of the CPU, the choice and its warning."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lcft.config import ConfigError
from lcft.train import precision as prec
from lcft.train.config import TrainConfig
from lcft.train.trainer import train
from tests.one_line import one_line

# In a fresh interpreter with oneDNN (the library PyTorch's CPU bf16 matmuls go through) saying which instruction
# set it found and which kernels it ran: a copy into its own layout starts it on any x86 CPU (PyTorch sends bf16
# work to it only where it reports AVX-512 or better: an AVX2 CPU would print nothing), then a bf16 linear layer.
_ONEDNN_PROBE = """
import torch
torch.ones(4, 64).to_mkldnn()
torch.nn.functional.linear(torch.ones(4, 64, dtype=torch.bfloat16), torch.ones(32, 64, dtype=torch.bfloat16))
"""
_ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # would make oneDNN report less than the CPU has


def _onednn_report() -> tuple[str, list[str]]:
    """(the instruction set oneDNN reports for this CPU, the kernels it ran on bf16 data) from its verbose log:
    oneDNN reads the CPU with its own CPUID code (xbyak), neither /proc/cpuinfo nor PyTorch's cpuinfo checks."""
    env = {k: v for k, v in os.environ.items() if k not in _ISA_CAPS}
    res = subprocess.run([sys.executable, "-c", _ONEDNN_PROBE], env={**env, "ONEDNN_VERBOSE": "1"},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    isa = [line.partition(",isa:")[2] for line in res.stdout.splitlines()
           if line.startswith("onednn_verbose,") and ",cpu,isa:" in line]
    assert len(isa) == 1, f"oneDNN reported no instruction set:\n{res.stdout[-2000:]}"
    # onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src:bf16::blocked:ab::f0 ...
    kernels = [fields[6] for line in res.stdout.splitlines()
               if len(fields := line.split(",")) > 8 and fields[2:5] == ["primitive", "exec", "cpu"]
               and "bf16" in fields[8]]
    return isa[0], kernels


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available(),
                    reason="oneDNN reports its x86 instruction set only")
def test_detection_agrees_with_onednn() -> None:
    """The oracle is oneDNN's own reading of the CPU: its instruction set names bfloat16 where the CPU has bf16
    arithmetic (AVX-512 BF16, AMX) or is 'Intel AVX 10.x' (BF16 included), 'Intel AVX2 ...' at most where it has
    none; AVX2 VNNI-2's bfloat16 is conversion only (AVX-NE-CONVERT, no bf16 dot product). A bf16 linear layer then runs a bf16 kernel there
    (brg_matmul:avx512_core_bf16, :avx10_1_512_amx), and none elsewhere (emulated, or not sent to oneDNN)."""
    isa, kernels = _onednn_report()
    # AVX10.1 is AVX-512 with BF16 and FP16 by definition: oneDNN 3.12 names it without the word
    native = ("bfloat16" in isa or isa.startswith("Intel AVX 10")) and not isa.startswith("Intel AVX2")
    assert prec.cpu_has_native_bf16() is native, f"oneDNN reports {isa!r}"
    # the ISA in the kernel's name: brg_matmul:avx512_core_bf16 is native, gemm:jit:bf16 (AVX-512 without BF16)
    # emulates bf16 in fp32
    bf16_kernels = [k for k in kernels if re.search(r"avx512_core_(bf16|fp16|amx)|avx10_|amx", k)]
    if native:
        assert kernels and bf16_kernels == kernels, (isa, kernels)
    else:
        assert not bf16_kernels, (isa, kernels)


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
