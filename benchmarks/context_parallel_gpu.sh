#!/usr/bin/env bash
# Context parallelism on one multi-GPU node (NCCL): a 1M-token window through the tiny-shaped model with sparse
# attention (Triton kernels, block 128), one training step per case, bf16 autocast. Not part of CI.
#
#   bash benchmarks/context_parallel_gpu.sh            # all GPUs of the node
#   NGPU=4 LENGTH=2M bash benchmarks/context_parallel_gpu.sh
#
# Each line: worst rank's peak device memory, step time, per-rank compute time (step minus time in collectives)
# and its imbalance, bytes each rank sent. cp=1 is the one-GPU baseline (it may run out of memory at long
# lengths: that is what context parallelism is for). Several nodes: the same commands with torchrun's
# --nnodes/--node-rank/--rdzv-endpoint instead of --standalone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
LENGTH=${LENGTH:-1M}
BLOCK=${BLOCK:-128}
# every case on one window: a multiple of 2 x cp x block for cp = NGPU (1M is not one for 3, 5, 6 or 7 GPUs)
LENGTH=$("$PY" -c "from lcft.config import parse_size; u = 2 * $NGPU * $BLOCK; print(parse_size('$LENGTH') // u * u)")
ARGS=(--torchrun --device cuda --bf16 --length "$LENGTH" --block "$BLOCK" --steps 2)
run() {  # run NPROC LAYOUT KV
  echo "== cp=$1 layout=$2 kv=$3 (window $LENGTH)"
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$1" benchmarks/context_parallel.py \
    "${ARGS[@]}" --layout "$2" --kv "$3" || echo "   cp=$1 $2 $3 failed (exit $?)"
}
run 1 zigzag all
for KV in all selected stream; do  # stream: PyTorch piece kernels (no Triton version yet)
  run "$NGPU" zigzag "$KV"
done
run "$NGPU" contiguous all
