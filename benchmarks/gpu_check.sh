#!/usr/bin/env bash
# `make gpu-check`: from a fresh clone on a machine with one NVIDIA GPU, install CUDA torch and triton into
# .venv-gpu, then run benchmarks/gpu_check.py (pytest -m gpu, attention and 1b-preset training benchmarks).
# Results: gpu-check-out/gpu-check.json and gpu-check.md. Non-zero exit on a failed test or numeric mismatch.
#   PY=python3.12 TORCH_SPEC='torch==2.13.0' bash benchmarks/gpu_check.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${VENV:-.venv-gpu}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}  # the CUDA build of the version the CPU venv pins (PyPI's Linux wheel)
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU found (nvidia-smi); this check needs one." >&2
  exit 2
fi
nvidia-smi -L
start=$(date +%s)
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$TORCH_SPEC"  # pulls the matching triton and CUDA runtime wheels
"$VENV/bin/pip" install -q -e '.[dev,kernels]'
"$VENV/bin/python" -c "import torch, triton; assert torch.cuda.is_available(), 'torch has no CUDA'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
echo "gpu-check: installed in $(( $(date +%s) - start )) s"
"$VENV/bin/python" benchmarks/gpu_check.py --out gpu-check-out "$@"
echo "gpu-check: done in $(( $(date +%s) - start )) s"
