"""Compute precision by device capability: bf16 on CUDA, and on CPU only where the CPU has native bf16 units.

Why: CPUs differ by two orders of magnitude. With AVX-512 BF16 or AMX a bf16 matmul runs about 3x the fp32 one;
on an AVX2-only CPU (e.g. AMD EPYC without AVX-512 BF16) PyTorch emulates bf16 and a matmul measured
0.3 GFLOP/s against 158 GFLOP/s in fp32, 500x slower. `auto` must therefore never pick bf16 on such a CPU.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from lcft.errors import LcftError
from lcft.parallel.config import Precision, PrecisionChoice

# /proc/cpuinfo flags of native bf16 arithmetic: x86 AVX-512 BF16 and AMX BF16 tiles, Arm's BF16 extension.
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def _cpuinfo_flags() -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (x86 'flags', Arm 'Features'); empty elsewhere."""
    path = Path("/proc/cpuinfo")
    if not sys.platform.startswith("linux") or not path.is_file():
        return set()
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX-512 BF16, AMX or Arm BF16), as PyTorch's own CPU checks
    or the kernel's feature flags report it."""
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        fn = getattr(torch.cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except RuntimeError:  # a build without the check
            continue
    return bool(_BF16_FLAGS & _cpuinfo_flags())


def cpu_describe() -> str:
    """One line naming this CPU and its bf16 support, for benchmark reports."""
    name = ""
    path = Path("/proc/cpuinfo")
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    cap = torch.backends.cpu.get_cpu_capability()
    bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16"
    amx = ", AMX" if "amx_bf16" in _cpuinfo_flags() else ""  # torch's capability reports AMX CPUs as AVX512
    return f"{name or 'unknown CPU'} ({cap}, {bf16}{amx})"


def choose_precision(requested: PrecisionChoice, cpu: bool) -> tuple[Precision, str | None]:
    """(precision to run, warning or None) for --precision auto|fp32|bf16 on a CPU or CUDA run: auto = bf16 on
    GPUs with bf16 tensor cores and on CPUs with native bf16, fp32 on others; an explicit bf16 there is honoured
    with a warning saying how slow it will be."""
    if requested == "fp32":
        return "fp32", None
    if not cpu:
        # a GPU without bf16 tensor cores (compute capability < 8.0: V100, T4) emulates it, and Triton's bf16 dots
        # do not compile there; without a visible GPU (lcft plan for CUDA) bf16 is assumed
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported(including_emulation=False):
            if requested == "auto":
                return "fp32", None
            return "bf16", ("warning: --precision bf16 on a GPU without bf16 tensor cores (compute capability < 8.0): "
                            "emulated and slow; --precision auto picks fp32 here")
        return "bf16", None
    native = cpu_has_native_bf16()
    if requested == "auto":
        return ("bf16" if native else "fp32"), None
    if native:
        return "bf16", None
    return "bf16", ("warning: --precision bf16 on a CPU without native bf16 (no AVX-512 BF16, AMX or Arm BF16): "
                    "PyTorch emulates it, matmuls run up to ~500x slower than fp32; --precision auto picks fp32 here")


def bench_dtype() -> str:
    """'bf16' where this machine runs bf16 fast (CUDA, or a CPU with native bf16), else 'fp32': the default
    dtype of benchmarks that would otherwise assume bf16."""
    return choose_precision("auto", cpu=not torch.cuda.is_available())[0]


def offload_dtype(offload_bf16: bool, precision: Precision) -> torch.dtype | None:
    """The dtype offloaded block inputs are kept in: bf16 when asked for, which only a bf16 run may (an fp32 run
    would lose the precision it computes in); None = the inputs' own."""
    if not offload_bf16:
        return None
    if precision != "bf16":
        raise LcftError("--offload-bf16 needs bf16 precision: this run computes in fp32 (--precision bf16, on CUDA "
                        "or a CPU with native bf16)")
    return torch.bfloat16
