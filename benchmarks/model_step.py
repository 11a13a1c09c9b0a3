"""Train step (forward, backward, AdamW) of the tiny-shaped model: lcft's Llama vs transformers' LlamaForCausalLM.

Same config (hidden 256, 4 layers, 4 heads, intermediate 704, vocab 16), CPU, fp32 and bf16 autocast, at 4K and
16K tokens: tokens/s and peak RSS of each, side by side, as ratios. Ours runs plain at 4K and with block
checkpointing + chunked cross-entropy at 16K. Then ours alone at 64K, 256K and 1M tokens (sparse attention, or
dense with --long-backend dense; bf16 where the CPU has native bf16, else fp32) until a length does not finish within --max-seconds.

Peak RSS: each side in a fresh subprocess (both import torch, transformers and lcft, so the import footprint
is the same). Speed: both sides in one process, steps alternating, so both see the same load on a shared
machine. `--quick` = 4K only. `--family qwen3|mixtral`: the same comparison for a Qwen3-style (qk-norm, GQA,
head_dim 96) or Mixtral-style (8 experts, top-2) shape against transformers' Qwen3/Mixtral classes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30
SHAPE = dict(vocab_size=16, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, rope_theta=1e6, max_position_embeddings=1 << 20, tie_word_embeddings=False)
# --family: (transformers config and model class, shape changes shared by both sides, lcft-only config fields)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, {}),
    # Qwen3-style: qk-norm, GQA 4:2, an explicit head_dim (not hidden / heads)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 96},
              {"model_type": "qwen3", "qk_norm": True}),
    # Mixtral-style: 8 experts of the tiny MLP's width, top-2, GQA 4:2
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_key_value_heads": 2, "num_local_experts": 8,
                                                         "num_experts_per_tok": 2},
                {"model_type": "mixtral"}),
}


def build(impl: str, case: dict):
    """(model, loss function) for one side; both predict token t+1 from tokens <= t of the same ids."""
    import torch
    import transformers

    import lcft.model as lm
    from lcft.kernels import chunked_cross_entropy
    from lcft.parallel.activations import DEFAULT_SEQ_CHUNK, apply_activation_checkpointing

    torch.manual_seed(0)
    n = case["length"]
    ids = torch.randint(4, 8, (1, n))
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], 1)  # next token; the last one has no label
    cfg_cls, model_cls, shape, ours_only = FAMILIES[case.get("family", "llama")]
    shape = {**SHAPE, **shape}
    if impl == "hf":
        extra = {"sliding_window": None} if "sliding_window" in getattr(transformers, cfg_cls)().to_dict() else {}
        cfg = getattr(transformers, cfg_cls)(**shape, **extra, use_cache=False, rope_parameters={
            "rope_type": "default", "rope_theta": SHAPE["rope_theta"]})
        model = getattr(transformers, model_cls)._from_config(cfg, attn_implementation="sdpa")

        def loss_fn():
            return model(input_ids=ids, labels=ids, use_cache=False).loss  # HF shifts the labels itself
    else:
        attention = lm.AttentionConfig(backend="sparse" if case["sparse"] else "dense")
        model = lm.Llama(lm.LlamaConfig(**shape, **ours_only, attention=attention))
        if case["checkpoint"]:
            apply_activation_checkpointing(model, "block", seq_chunk=case["seq_chunk"] or DEFAULT_SEQ_CHUNK)

        def loss_fn():
            loss_sum, count = chunked_cross_entropy(model.hidden_states(ids), model.lm_head_weight, labels)
            return loss_sum / count.clamp(min=1)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case["dtype"] == "bf16"):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, loss.item()

    return step


def run_case(case: dict) -> dict:
    """Inside a fresh process. mode 'memory': one side, warm-up + one step, peak RSS (AdamW state exists
    after the first step, so the peak is reached by the second). mode 'time': both sides in this process,
    steps alternating ours/theirs so both see the same machine load; tokens/s from each side's fastest
    timed step (other load on a shared machine only ever slows a step down)."""
    import torch

    if case.get("max_gib"):  # a shared machine: fail this process cleanly rather than invite the OOM killer
        limit = int(case["max_gib"] * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if case["threads"]:
        torch.set_num_threads(case["threads"])
    if case["mode"] == "memory":
        if case["impl"] == "lcft":  # what `lcft train` does for long windows (a no-op below 64K tokens)
            from lcft.train.memory import return_freed_buffers_to_os

            return_freed_buffers_to_os(case["length"])
        step = build(case["impl"], case)
        times = [step() for _ in range(case["warmup"] + 1)]
        return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "step_s": times[-1][0], "loss": times[-1][1], "tok_s": case["length"] / times[-1][0]}
    steps = {impl: build(impl, {**case, "checkpoint": case["checkpoint"] and impl == "lcft"}) for impl in ("hf", "lcft")}
    times: dict[str, list[float]] = {impl: [] for impl in steps}
    for i in range(case["warmup"] + case["steps"]):
        for impl, step in steps.items():
            t, _ = step()
            if i >= case["warmup"]:
                times[impl].append(t)
    return {impl: case["length"] / min(t) for impl, t in times.items()}


def spawn(case: dict, timeout: float | None) -> dict | None:
    """Run a case in a fresh interpreter; None if it timed out or failed (the reason is printed)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(case)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  {label(case)}: did not finish within {timeout:.0f} s", flush=True)
        return None
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {label(case)}: failed (exit {p.returncode}): {tail}", flush=True)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def label(case: dict) -> str:
    who = {"hf": "transformers", "both": "lcft vs transformers"}.get(case["impl"], "lcft")
    return f"{case['mode']} {who}{' +ckpt' if case['checkpoint'] else ''} {case['dtype']} {case['length'] // 1024}K" + (" sparse" if case.get("sparse") else "")


def case(mode: str, impl: str, dtype: str, length: int, checkpoint: bool, args: argparse.Namespace,
         sparse: bool = False, warmup: int = 1) -> dict:
    return {"mode": mode, "impl": impl, "dtype": dtype, "length": length, "checkpoint": checkpoint,
            "sparse": sparse, "warmup": warmup, "steps": args.steps, "threads": args.threads,
            "seq_chunk": args.seq_chunk, "family": args.family}


def main() -> int:
    from lcft.train.precision import bench_dtype, cpu_describe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4K only (< 1 minute)")
    ap.add_argument("--family", default="llama", choices=list(FAMILIES),
                    help="model shape: llama (the tiny preset), qwen3 (qk-norm, GQA, head_dim 96) or mixtral "
                    "(8 experts, top-2, GQA), against transformers' own class of that family")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per case after one warm-up step "
                    "(tokens/s from the fastest)")
    ap.add_argument("--dtypes", default="fp32,bf16" if bench_dtype() == "bf16" else "fp32",
                    help="comma list of fp32, bf16 (default: bf16 too only where this CPU has native bf16)")
    ap.add_argument("--long", default="64K,256K,1M", help="lengths for ours alone ('' to skip)")
    ap.add_argument("--long-backend", default="sparse", choices=["sparse", "dense"],
                    help="attention backend of the long lengths")
    ap.add_argument("--sparse", action="store_true", help=argparse.SUPPRESS)  # the old spelling of the default
    ap.add_argument("--long-dtype", default=bench_dtype(), choices=["fp32", "bf16"], help="dtype of the long "
                    "lengths (default: bf16 where this CPU has native bf16, about 3x fp32 there; fp32 on CPUs "
                    "that emulate it, up to ~500x slower)")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="time limit of one long-length step")
    ap.add_argument("--max-gib", type=float, default=22.0, help="address-space limit of one long-length "
                    "process (it fails with an out-of-memory error instead of swapping a shared machine)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--seq-chunk", type=int, default=0, help="tokens per chunk of a block's token-wise work "
                    "under block checkpointing (0 = lcft's default, lcft.parallel.activations.DEFAULT_SEQ_CHUNK)")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return 0

    from lcft.config import format_size, parse_size

    print(f"CPU: {cpu_describe()}")
    lengths = [4096] if args.quick else [4096, 16384]
    print(f"{'case':<14}{'transformers tok/s':>19}{'lcft tok/s':>12}{'ratio':>7}"
          f"{'transformers peak':>19}{'lcft peak':>11}{'ratio':>7}  lcft setting", flush=True)
    for dtype in [d for d in args.dtypes.split(",") if d]:  # --dtypes '' = long lengths only
        for n in lengths:
            ckpt = n > 4096  # the benchmark targets: plain at 4K, checkpointing at 16K
            theirs = spawn(case("memory", "hf", dtype, n, False, args), None)
            ours = spawn(case("memory", "lcft", dtype, n, ckpt, args), None)
            speed = spawn(case("time", "both", dtype, n, ckpt, args), None)
            if not (theirs and ours and speed):
                continue
            print(f"{dtype + ' ' + format_size(n):<14}{speed['hf']:>19,.0f}{speed['lcft']:>12,.0f}"
                  f"{speed['lcft'] / speed['hf']:>6.2f}x{theirs['peak_rss'] / GIB:>15.2f} GiB"
                  f"{ours['peak_rss'] / GIB:>7.2f} GiB{ours['peak_rss'] / theirs['peak_rss']:>6.2f}x  "
                  f"{'block checkpointing' if ckpt else 'no checkpointing'}", flush=True)
    if args.quick or not args.long:
        return 0

    kind = args.long_backend
    print(f"\nlcft alone, {args.long_dtype}, block checkpointing, {kind} attention, one step each, cold "
          f"(limit {args.max_seconds:.0f} s):", flush=True)
    largest = None
    for n in (parse_size(s) for s in args.long.split(",")):
        c = {**case("memory", "lcft", args.long_dtype, n, True, args, sparse=kind == "sparse", warmup=0),
             "max_gib": args.max_gib}
        r = spawn(c, args.max_seconds)
        if r is None:
            break
        largest = n
        print(f"  {format_size(n):>5}: {r['step_s']:8.1f} s/step {r['tok_s']:>9,.0f} tok/s  "
              f"peak RSS {r['peak_rss'] / GIB:.2f} GiB  loss {r['loss']:.3f}", flush=True)
    print(f"largest length finished within {args.max_seconds:.0f} s: "
          f"{format_size(largest) if largest else 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
