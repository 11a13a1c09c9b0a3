"""GPU benchmark: Triton block-sparse attention vs dense flash-attn (or SDPA), bf16, 32K-1M tokens, TFLOP/s.

Needs one CUDA GPU; without one it says so and exits 0 (it is not part of CI). It first checks the compiled
Triton kernels against the reference on a small shape (the CPU tests only run them under the interpreter),
then times selection, forward and forward+backward at each length. TFLOP/s counts useful FLOPs: causal pairs
for dense, the chosen pairs for sparse (FLOPS_PER_PAIR: 4·D FLOPs per pair forward, 12·D forward+backward).
"""

from __future__ import annotations

import argparse
import sys

HQ, HKV, DIM, BLOCK, TOP_K, LOCAL, SINK = 32, 8, 128, 128, 16, 1, 1
K = 1024
# x head_dim x heads per (query, key) pair, forward + backward: QK^T and PV forward (2 + 2), dV, dP, dQ and dK
# backward (4 x 2); the backward's recompute of QK^T is not counted (flash-attn's own figures count it: 14)
FLOPS_PER_PAIR = 12


def causal_pairs(length: int) -> int:
    return length * (length + 1) // 2


def sparse_pairs(length: int, block: int, budget: int) -> int:
    n = length // block
    return sum((min(i + 1, budget) - 1) * block * block + block * (block + 1) // 2 for i in range(n))


def timed(fn, repeat: int, device: str = "cuda") -> float:
    """Median seconds of fn() over `repeat` runs, after one warm-up, with CUDA events (the wall clock on CPU)."""
    import time

    import torch

    fn()
    times = []
    for _ in range(repeat):
        if device == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def check_kernels() -> None:
    """Compiled Triton kernels vs the reference (bf16 tolerance) and selection ids vs the PyTorch selection."""
    import torch

    from lcft.kernels import SparseSpec, sparse_attention, sparse_attention_with_indices
    from lcft.kernels.selection import block_means, select_blocks_torch

    torch.manual_seed(0)
    q = torch.randn(1, 8, 4096, 64, device="cuda", requires_grad=True)
    k = torch.randn(1, 2, 4096, 64, device="cuda", requires_grad=True)
    v = torch.randn(1, 2, 4096, 64, device="cuda", requires_grad=True)
    spec = SparseSpec(block_size=64, top_k=4, local_blocks=1, sink_blocks=1)
    out, idx = sparse_attention(q, k, v, spec, impl="triton", return_indices=True)
    same_ids = torch.equal(idx, select_blocks_torch(q.detach(), block_means(k.detach(), 64), spec))
    ref = sparse_attention_with_indices(q, k, v, idx, block_size=64, impl="reference")
    dout = torch.randn_like(out)
    got = [out, *torch.autograd.grad(out, (q, k, v), dout)]
    want = [ref, *torch.autograd.grad(ref, (q, k, v), dout)]
    errs = [(a - b).abs().max().item() for a, b in zip(got, want, strict=True)]
    ok = same_ids and max(errs) < 1e-3
    print(f"check fp32 (4K, GQA 8/2): indices equal {same_ids}; max |err| out/dq/dk/dv "
          + " ".join(f"{e:.1e}" for e in errs) + ("  OK" if ok else "  MISMATCH"))
    if not ok:
        sys.exit(1)


def bench_length(length: int, dense, repeat: int) -> None:
    """Time selection, sparse fwd and fwd+bwd, dense fwd and fwd+bwd at one length; print one row."""
    import torch

    from lcft.kernels import SparseSpec, select_blocks, sparse_attention_with_indices

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, h, length, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for h in (HQ, HKV, HKV, HQ))
    q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    spec = SparseSpec(block_size=BLOCK, top_k=TOP_K, local_blocks=LOCAL, sink_blocks=SINK)
    t_sel = timed(lambda: select_blocks(q.detach(), k.detach(), spec), repeat)
    idx = select_blocks(q.detach(), k.detach(), spec)

    def sparse():
        return sparse_attention_with_indices(q, k, v, idx, block_size=BLOCK, impl="triton")

    t_sf = timed(sparse, repeat)
    t_sfb = timed(lambda: torch.autograd.grad(sparse(), (q, k, v), dout), repeat)
    try:
        t_df = timed(lambda: dense(q, k, v), repeat)
        t_dfb = timed(lambda: torch.autograd.grad(dense(q, k, v), (q, k, v), dout), repeat)
    except torch.OutOfMemoryError:
        t_df = t_dfb = float("nan")
    sp, dp = sparse_pairs(length, BLOCK, TOP_K + LOCAL + SINK + 1), causal_pairs(length)
    tf_s = FLOPS_PER_PAIR * DIM * HQ * sp / t_sfb / 1e12
    tf_d = FLOPS_PER_PAIR * DIM * HQ * dp / t_dfb / 1e12
    print(f"{length // K:>5}K {t_sel * 1e3:>10.2f} {t_sf * 1e3:>9.1f}ms {t_sfb * 1e3:>9.1f}ms "
          f"{t_df * 1e3:>8.1f}ms {t_dfb * 1e3:>8.1f}ms {tf_s:>12.1f} {tf_d:>11.1f} {t_dfb / t_sfb:>7.2f}x "
          f"{dp / sp:>10.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="32K only")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("attention_gpu.py: torch is not installed; nothing to run.")
        return
    if not torch.cuda.is_available():
        print("attention_gpu.py: no CUDA GPU found; this benchmark needs one (it is not run in CI). Nothing to run.")
        return
    import torch.nn.functional as F

    try:
        from flash_attn import flash_attn_func

        def dense(q, k, v):  # flash-attn takes (B, L, H, D)
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
            return out.transpose(1, 2)

        dense_name = "flash-attn"
    except ImportError:
        def dense(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        dense_name = "SDPA"
    check_kernels()
    print(f"\n{torch.cuda.get_device_name()}: Triton sparse vs {dense_name} dense, bf16, B=1 Hq={HQ} Hkv={HKV} "
          f"D={DIM} block={BLOCK} top_k={TOP_K} local={LOCAL} sink={SINK}")
    head = (f"{'L':>6} {'select ms':>10} {'sparse fwd':>11} {'sparse f+b':>11} {'dense fwd':>10} {'dense f+b':>10} "
            f"{'sparse TF/s':>12} {'dense TF/s':>11} {'speedup':>8} {'FLOP ratio':>10}")
    print(head + "\n" + "-" * len(head))
    lengths = [32 * K] if args.quick else [32 * K, 64 * K, 128 * K, 256 * K, 512 * K, 1024 * K]
    for length in lengths:
        bench_length(length, dense, args.repeat)
        torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
