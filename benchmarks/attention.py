"""Benchmark: `cpu` block-sparse attention vs dense causal SDPA, forward+backward on CPU, one fresh process per case.

Prints time, peak RSS, the FLOP ratio dense/sparse, the measured speedup and the speedup as a share of the
FLOP ratio, in fp32 and bf16; then sparse alone at 256K and 1M tokens with peak RSS minus the unavoidable
tensors (q, k, v, out and their four gradients). `--quick` runs 8K and 16K only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from lcft.config import parse_size
from lcft.train.precision import bench_dtype, cpu_describe

HEADS, DIM, BLOCK, TOP_K, LOCAL, SINK = 4, 64, 64, 16, 1, 1
BUDGET = TOP_K + LOCAL + SINK + 1
K = 1024


def pairs_dense(length: int) -> int:
    """(query, key) pairs of causal attention per head."""
    return length * (length + 1) // 2


def pairs_sparse(length: int) -> int:
    """(query, key) pairs the sparse kernel computes per head: full chosen blocks plus the causal own block."""
    n = length // BLOCK
    return sum((min(i + 1, BUDGET) - 1) * BLOCK * BLOCK + BLOCK * (BLOCK + 1) // 2 for i in range(n))


def run_case(impl: str, length: int, dtype_name: str, threads: int) -> dict:
    """Inside the child process: one fwd+bwd after a small warm-up; time and peak RSS."""
    import resource

    import torch
    import torch.nn.functional as F

    from lcft.kernels import SparseSpec, sparse_attention

    if threads > 0:
        torch.set_num_threads(threads)

    dtype = getattr(torch, dtype_name)

    def step(n: int) -> float:
        gen = torch.Generator().manual_seed(0)
        q, k, v, dout = (torch.randn(1, HEADS, n, DIM, generator=gen, dtype=dtype) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        start = time.perf_counter()
        if impl == "dense":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            spec = SparseSpec(block_size=BLOCK, top_k=TOP_K, local_blocks=LOCAL, sink_blocks=SINK)
            out = sparse_attention(q, k, v, spec, impl="cpu")
        out.backward(dout)
        return time.perf_counter() - start

    step(2048)  # warm-up: kernels, allocator, thread pool
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = step(length)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    unavoidable = 8 * HEADS * length * DIM * dtype.itemsize  # q, k, v, out, dq, dk, dv, dout
    return {"seconds": seconds, "peak_rss": peak, "extra": peak - rss0 - unavoidable, "threads": torch.get_num_threads()}


def spawn(impl: str, length: int, dtype_name: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--case", json.dumps([impl, length, dtype_name, threads])]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def gib(n: float) -> str:
    return f"{n / 2**30:6.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="8K and 16K only (< 1 minute)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per case (default 1: a per-core comparison that stays meaningful on a "
                         "shared machine; 0 = torch's default)")
    ap.add_argument("--lengths", help="comma list of lengths for the side-by-side table (e.g. 32K,64K)")
    ap.add_argument("--dtypes", default="float32,bfloat16" if bench_dtype() == "bf16" else "float32",
                    help="comma list of float32, bfloat16 (default: bfloat16 too only where this CPU has "
                         "native bf16; emulated bf16 is up to ~500x slower)")
    ap.add_argument("--no-long", action="store_true", help="skip the sparse-alone 256K and 1M runs")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(*json.loads(args.case))))
        return
    lengths = [8 * K, 16 * K] if args.quick else [8 * K, 16 * K, 32 * K, 64 * K]
    if args.lengths:
        lengths = [parse_size(x) for x in args.lengths.split(",")]
    print(f"CPU: {cpu_describe()}")
    print(f"sparse attention (cpu) vs dense SDPA(is_causal), fwd+bwd, B=1 Hq=Hkv={HEADS} D={DIM} block={BLOCK} "
          f"top_k={TOP_K} local={LOCAL} sink={SINK} (budget {BUDGET} blocks); one fresh process per case, "
          f"threads={args.threads or 'torch default'}")
    head = (f"{'dtype':>8} {'L':>6} {'dense s':>9} {'sparse s':>9} {'dense RSS':>11} {'sparse RSS':>11} "
            f"{'FLOP ratio':>10} {'speedup':>8} {'% of ratio':>10}")
    print(head)
    print("-" * len(head))
    for dtype_name in args.dtypes.split(","):
        for length in lengths:
            dense, sparse = spawn("dense", length, dtype_name, args.threads), spawn("sparse", length, dtype_name, args.threads)
            if "error" in dense or "error" in sparse:
                print(f"{dtype_name:>8} {length // K:>5}K  failed: {dense.get('error') or sparse.get('error')}")
                continue
            ratio = pairs_dense(length) / pairs_sparse(length)
            speedup = dense["seconds"] / sparse["seconds"]
            print(f"{dtype_name:>8} {length // K:>5}K {dense['seconds']:>9.2f} {sparse['seconds']:>9.2f} "
                  f"{gib(dense['peak_rss']):>11} {gib(sparse['peak_rss']):>11} {ratio:>10.2f} {speedup:>7.2f}x "
                  f"{100 * speedup / ratio:>9.0f}%", flush=True)
    if args.quick or args.no_long:
        return
    print("\nsparse attention (cpu) alone, fwd+bwd, float32; extra = peak RSS - RSS before - q,k,v,out and grads")
    print(f"{'L':>6} {'seconds':>9} {'peak RSS':>11} {'extra':>11}")
    for length in (256 * K, 1024 * K):
        res = spawn("sparse", length, "float32", args.threads)
        if "error" in res:
            print(f"{length // K:>5}K  failed: {res['error']}")
            continue
        print(f"{length // K:>5}K {res['seconds']:>9.1f} {gib(res['peak_rss']):>11} {gib(res['extra']):>11}", flush=True)


if __name__ == "__main__":
    main()
