"""One-GPU check: `pytest -m gpu`, then Triton sparse vs dense flash attention and 1b-preset training steps.

Writes <out>/gpu-check.json and <out>/gpu-check.md; exits 1 on any failed test or numeric mismatch, 0 otherwise.
Without CUDA it says so and exits 2 (nothing measured). Run by `make gpu-check` (benchmarks/gpu_check.sh), which
installs CUDA torch and triton into .venv-gpu first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
K = 1024
# Dense bf16 tensor-core peak, FLOP/s, by device-name fragment (MFU denominator).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "B200": 2250e12, "L40S": 362e12, "4090": 165e12}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-check-out", help="folder of the JSON and markdown")
    ap.add_argument("--quick", action="store_true", help="32K attention and a 128K step only")
    ap.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    ap.add_argument("--attention", default="32K,128K,512K,1M", help="attention benchmark lengths")
    ap.add_argument("--train", default="128K,1M", help="1b-preset training-step lengths")
    ap.add_argument("--repeat", type=int, default=3, help="timed repeats per attention case")
    ap.add_argument("--dense-max", default="512K", help="longest length dense attention is timed at (budget)")
    return ap.parse_args(argv)


def lengths(text: str) -> list[int]:
    """'32K,1M' -> [32768, 1048576]."""
    mult = {"K": K, "M": K * K}
    return [int(t[:-1]) * mult[t[-1].upper()] if t[-1].upper() in mult else int(t) for t in text.split(",") if t]


def run_tests() -> dict:
    """`pytest -m gpu tests/gpu` in a subprocess: pass/fail and the summary line."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests" / "gpu")],
                         capture_output=True, text=True, cwd=ROOT)
    tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-500:]
    print(res.stdout[-4000:], flush=True)
    return {"ok": res.returncode == 0, "summary": tail, "seconds": time.perf_counter() - t0}


def bench_attention(length: int, repeat: int, dense_max: int) -> dict:
    """Triton sparse fwd+bwd vs dense (flash-attn, else SDPA) fwd+bwd, bf16, the 1b preset's heads at D=128."""
    import torch
    import torch.nn.functional as F
    from attention_gpu import BLOCK, DIM, HKV, HQ, LOCAL, SINK, TOP_K, causal_pairs, sparse_pairs, timed

    from lcft.kernels import SparseSpec, select_blocks, sparse_attention_with_indices

    spec = SparseSpec(block_size=BLOCK, top_k=TOP_K, local_blocks=LOCAL, sink_blocks=SINK)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, h, length, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for h in (HQ, HKV, HKV, HQ))
    q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    idx = select_blocks(q.detach(), k.detach(), spec)
    sparse = lambda: sparse_attention_with_indices(q, k, v, idx, block_size=BLOCK, impl="triton")  # noqa: E731
    dense = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    t_s = timed(lambda: torch.autograd.grad(sparse(), (q, k, v), dout), repeat)
    t_d = float("nan")
    if length <= dense_max:
        try:
            t_d = timed(lambda: torch.autograd.grad(dense(), (q, k, v), dout), repeat)
        except torch.OutOfMemoryError:
            pass
    sp, dp = sparse_pairs(length, BLOCK, spec.budget), causal_pairs(length)
    row = {"length": length, "sparse_ms": t_s * 1e3, "dense_ms": t_d * 1e3,
           "sparse_tflops": 10 * DIM * HQ * sp / t_s / 1e12, "dense_tflops": 10 * DIM * HQ * dp / t_d / 1e12,
           "speedup": t_d / t_s, "flop_ratio": dp / sp}
    print(json.dumps(row), flush=True)
    return row


def bench_train(length: int) -> dict:
    """One 1b-preset step (sparse attention, block checkpointing, chunked CE, bf16 autocast, AdamW) after a warm-up."""
    import torch

    import lcft.model as lm
    from lcft.kernels import SparseSpec, chunked_cross_entropy
    from lcft.parallel.activations import apply_activation_checkpointing

    cfg = lm.preset("1b")
    cfg.vocab_size = 16
    cfg.attention = lm.AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=128, top_k=16))
    torch.manual_seed(0)
    model = lm.Llama(cfg).cuda()
    apply_activation_checkpointing(model, "block")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(4, 8, (1, length), device="cuda")
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100, device="cuda")], 1)

    def step() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_sum, count = chunked_cross_entropy(model.hidden_states(ids), model.lm_head_weight, labels)
        (loss_sum / count).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    step()
    torch.cuda.reset_peak_memory_stats()
    seconds = step()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    from attention_gpu import sparse_pairs

    attn = 12 * cfg.num_hidden_layers * heads * d * sparse_pairs(length, 128, 19)  # 4·D fwd + 8·D bwd per pair
    flops = 6 * n_params * length + attn
    peak = next((v for name, v in PEAK_BF16.items() if name in torch.cuda.get_device_name()), None)
    row = {"length": length, "step_s": seconds, "tokens_per_s": length / seconds,
           "mfu": flops / seconds / peak if peak else None,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(json.dumps(row), flush=True)
    return row


def markdown(res: dict) -> str:
    """The results as markdown tables (the JSON holds the same numbers)."""
    out = [f"# gpu-check on {res['device']}", "", f"tests: {res['tests'].get('summary', 'skipped')}", "",
           "| L | sparse f+b ms | dense f+b ms | sparse TFLOP/s | dense TFLOP/s | speedup | FLOP ratio |",
           "|---|---|---|---|---|---|---|"]
    for r in res["attention"]:
        out.append(f"| {r['length'] // K}K | {r['sparse_ms']:.1f} | {r['dense_ms']:.1f} | {r['sparse_tflops']:.0f} | "
                   f"{r['dense_tflops']:.0f} | {r['speedup']:.2f}x | {r['flop_ratio']:.2f} |")
    out += ["", "| 1b step L | s/step | tokens/s | MFU | peak GiB |", "|---|---|---|---|---|"]
    for r in res["train"]:
        mfu = f"{100 * r['mfu']:.0f}%" if r.get("mfu") is not None else "n/a"
        out.append(f"| {r['length'] // K}K | {r['step_s']:.1f} | {r['tokens_per_s']:.0f} | {mfu} | "
                   f"{r['peak_gib']:.1f} |" if "step_s" in r else f"| {r['length'] // K}K | {r['error']} | | | |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible to torch; nothing measured.", file=sys.stderr)
        return 2
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "attention": [], "train": [],
           "tests": {} if args.skip_tests else run_tests()}
    for n in lengths("32K" if args.quick else args.attention):
        res["attention"].append(bench_attention(n, args.repeat, lengths(args.dense_max)[0]))
        torch.cuda.empty_cache()
    for n in lengths("128K" if args.quick else args.train):
        try:
            res["train"].append(bench_train(n))
        except torch.OutOfMemoryError as e:
            res["train"].append({"length": n, "error": f"out of memory: {str(e).splitlines()[0][:80]}"})
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-check.json").write_text(json.dumps(res, indent=1))
    (args.out / "gpu-check.md").write_text(markdown(res))
    print(markdown(res))
    return 0 if res["tests"].get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
