"""One-GPU check: `pytest -m gpu`, Triton sparse vs flash attention, 1b-preset steps, 1M tokens as `lcft plan` lays them.

Prints one markdown table (also <out>/gpu-check.md; the numbers in <out>/gpu-check.json), whatever fails. Exits 1 on a
failed or skipped GPU test, a benchmark that failed (its row's error) or a non-finite output, 0 otherwise (a missed
target, or no layout for this GPU, shows in the table, not in the exit code). Without CUDA it says so and exits 2 (nothing measured). Run by `make gpu-check` (benchmarks/gpu_check.sh),
which installs lcft into .venv-gpu over the GPU's own torch first. Quick by default; --full runs the long sizes.
`--device cpu` rehearses the same code on the CPU at small sizes (no GPU figure; docs/cuda.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_check_plan import PLAN_STEP_TIMEOUT_S, bench_plan, node_memory, offload_budget, plan_step_in_child  # noqa: E402
from gpu_check_table import markdown  # noqa: E402
from gpu_check_train import bench_train  # noqa: E402

from lcft.config import parse_size  # noqa: E402 (standard library only; the path above finds lcft)

TESTS_TIMEOUT_S = 200  # pytest -m gpu (about 2 minutes on an H100/H200 with a cold Triton cache: docs/cuda.md)
# The quick run's whole time after the install (about a minute): a 10-minute slot keeps 1-2 minutes of margin. The
# 1M step's limit is what is left of it (at most PLAN_STEP_TIMEOUT_S); with under MIN_STEP_S left it is not started.
QUICK_BUDGET_S = 420
MIN_STEP_S = 60
# pytest as the GPU tests need it and no more: no plugin the node happens to have installed (their import time, their
# options), and gloo on loopback for the one-rank process groups (a node's default interface may not resolve)
TESTS_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
TESTS_ENV_DEFAULTS = {"GLOO_SOCKET_IFNAME": "lo"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-check-out",
                    help="folder of the JSON, the markdown and the GPU tests' JUnit XML (made if absent)")
    ap.add_argument("--quick", action="store_true", help="the default sizes (under 8 minutes on one H100/H200)")
    ap.add_argument("--full", action="store_true", help="also 512K and 1M attention and a timed 1M step")
    ap.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    ap.add_argument("--attention", default=None, help="attention lengths (default 32K,128K; --full 32K-1M)")
    ap.add_argument("--train", default=None, help="timed 1b-step lengths (default 128K; --full 128K,1M)")
    ap.add_argument("--plan-length", default=None,
                    help="length laid out by `lcft plan` for one GPU (default 1M; 1K on cpu; '' = skip)")
    ap.add_argument("--host-memory", default=None,
                    help="host memory the 1M plan must fit beside the GPU's (default: this node's physical memory, or "
                         "its container's limit when lower)")
    ap.add_argument("--gpu-memory", default=None,
                    help="one GPU's memory the plan step is laid out for (default: this GPU's total memory; on cpu just "
                         "enough for the layout with offloaded block inputs, the flags the 1M run takes)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repeats per attention case")
    ap.add_argument("--dense-max", default="512K", help="longest length dense attention is timed at (budget)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a rehearsal of the same code at small sizes (Triton under TRITON_INTERPRET=1; the "
                         "GPU tests report skipped; the plan's step at 1K); nothing it measures is a GPU figure")
    ap.add_argument("--plan-step", type=int, help=argparse.SUPPRESS)  # bench_plan in a child (plan_step_in_child)
    ap.add_argument("--preset", default=None, help="model of the timed train steps and the plan step (default 1b; tiny on cpu)")
    args = ap.parse_args(argv)
    if args.quick and args.full:
        ap.error("--quick and --full exclude each other")
    if args.device == "cpu":  # a rehearsal: every step of the run, at sizes a CPU finishes in seconds
        args.attention, args.train = args.attention or "256", args.train or "1K"
        args.preset = args.preset or "tiny"
        args.plan_length = "1K" if args.plan_length is None else args.plan_length
        if args.plan_length and not args.gpu_memory:
            args.gpu_memory = str(offload_budget(lengths(args.plan_length)[0], args.preset))
    args.host_memory = args.host_memory or str(node_memory())
    args.attention = args.attention or ("32K,128K,512K,1M" if args.full else "32K,128K")
    args.train = args.train or ("128K,1M" if args.full else "128K")
    args.preset = args.preset or "1b"
    args.plan_length = "1M" if args.plan_length is None else args.plan_length
    return args


def lengths(text: str) -> list[int]:
    """'32K,1M' -> [32768, 1048576]."""
    return [parse_size(t) for t in text.split(",") if t]


def run_tests(out: Path, on_gpu: bool = True) -> dict:
    """`pytest -m gpu tests/gpu` in a subprocess: each test's outcome (from its JUnit XML) and the summary line.
    On a GPU every test must pass: a skip there means a GPU test did not run (they skip only without CUDA)."""
    t0 = time.perf_counter()
    xml = out / "gpu-tests.xml"
    xml.unlink(missing_ok=True)  # a report left by an earlier run is never read as this one's
    env = TESTS_ENV_DEFAULTS | dict(os.environ) | TESTS_ENV
    try:
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests" / "gpu"),
                              f"--junitxml={xml}"], capture_output=True, text=True, cwd=ROOT, timeout=TESTS_TIMEOUT_S,
                             env=env)
    except subprocess.TimeoutExpired:  # a hung test must not take the benchmarks' time
        return {"ok": False, "summary": f"timed out after {TESTS_TIMEOUT_S} s", "cases": [],
                "seconds": time.perf_counter() - t0}
    print(res.stdout[-4000:], res.stderr[-2000:], flush=True)
    lines = res.stdout.strip().splitlines()
    cases = []
    if xml.is_file():  # our own pytest's report
        for case in ET.parse(xml).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            cases.append({"name": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome})
    ran = all(c["outcome"] == "passed" for c in cases) or not on_gpu
    return {"ok": res.returncode == 0 and bool(cases) and ran, "summary": lines[-1] if lines else res.stderr[-300:],
            "cases": cases, "seconds": time.perf_counter() - t0}


def dense_attention(q, k, v):
    """The dense baseline: flash-attn when installed, else SDPA held to its flash backend; (name, fn)."""
    import torch
    import torch.nn.functional as F

    try:
        from flash_attn import flash_attn_func

        qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))  # (B, L, H, D)
        return "flash-attn", (qt, kt, vt), lambda: flash_attn_func(qt, kt, vt, causal=True).transpose(1, 2)
    except ImportError:
        pass
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(a, b, c, gqa: bool):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=gqa)

    try:
        short = [t[:, :, :256].detach() for t in (q, k, v)]
        sdpa(*short, gqa=True)
        return "SDPA flash", (q, k, v), lambda: sdpa(q, k, v, gqa=True)
    except RuntimeError:  # this flash backend takes no GQA: the K/V heads repeated, the same FLOPs
        g = q.shape[1] // k.shape[1]
        kr, vr = (t.detach().repeat_interleave(g, dim=1).requires_grad_() for t in (k, v))  # (B, Hq, L, D)
        torch.cuda.empty_cache()
        return "SDPA flash (K/V repeated)", (q, kr, vr), lambda: sdpa(q, kr, vr, gqa=False)


def bench_attention(length: int, repeat: int, dense_max: int, device: str = "cuda") -> dict:
    """Triton sparse fwd+bwd vs dense (flash-attn, else SDPA's flash) fwd+bwd, bf16, the 1b preset's heads at D=128."""
    import torch
    from attention_gpu import (
        BLOCK,
        DIM,
        FLOPS_PER_PAIR,
        HKV,
        HQ,
        LOCAL,
        SINK,
        TOP_K,
        causal_pairs,
        sparse_pairs,
        timed,
    )

    from lcft.kernels import SparseSpec, select_blocks, sparse_attention_with_indices

    spec = SparseSpec(block_size=BLOCK, top_k=TOP_K, local_blocks=LOCAL, sink_blocks=SINK)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(1, h, length, DIM, device=device, dtype=torch.bfloat16, generator=gen)
                     for h in (HQ, HKV, HKV, HQ))
    q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    idx = select_blocks(q.detach(), k.detach(), spec)
    grads = torch.autograd.grad(sparse_attention_with_indices(q, k, v, idx, block_size=BLOCK, impl="triton"),
                                (q, k, v), dout)
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    t_s = timed(lambda: torch.autograd.grad(  # end to end: the block selection is part of sparse attention's cost
        sparse_attention_with_indices(q, k, v, select_blocks(q.detach(), k.detach(), spec), block_size=BLOCK,
                                      impl="triton"), (q, k, v), dout), repeat, device)
    name, t_d = "dense", float("nan")
    if length <= dense_max:
        try:
            name, inputs, dense = dense_attention(q, k, v)
            t_d = timed(lambda: torch.autograd.grad(dense(), inputs, dout), repeat, device)
        except torch.OutOfMemoryError:
            pass
    sp, dp = sparse_pairs(length, BLOCK, spec.budget), causal_pairs(length)
    row = {"length": length, "dense": name, "finite": finite, "sparse_ms": t_s * 1e3, "dense_ms": t_d * 1e3,
           "sparse_tflops": FLOPS_PER_PAIR * DIM * HQ * sp / t_s / 1e12,
           "dense_tflops": FLOPS_PER_PAIR * DIM * HQ * dp / t_d / 1e12, "flop_ratio": dp / sp}
    print(json.dumps(row), flush=True)
    return row



def guarded(row: dict, bench, *args, **kwargs) -> dict:
    """bench(*args, **kwargs)'s row, or `row` with the exception that stopped it as its error (type and first line): one failed
    benchmark costs its own row, not the rest of the run."""
    try:
        return bench(*args, **kwargs)
    except Exception as e:  # any failure of one benchmark is that row's finding; the run goes on
        first = (str(e).strip().splitlines() or [""])[0][:160]
        return row | {"error": f"{type(e).__name__}: {first}" if first else type(e).__name__}


def measure(args: argparse.Namespace, res: dict, save) -> None:
    """Every benchmark of the run into `res`, each in its own CUDA memory (the cache emptied between them), `save()`
    after each, so a run cut short keeps what it measured; the 1M plan step in its own process."""
    import torch

    def release() -> None:  # nothing of one benchmark left on the GPU for the next
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    for n in lengths(args.attention):
        res["attention"].append(guarded({"length": n}, bench_attention, n, args.repeat, lengths(args.dense_max)[0],
                                        args.device))
        release()
        save()
    for n in lengths(args.train):
        res["train"].append(guarded({"length": n, "preset": args.preset}, bench_train, n, device=args.device,
                                    preset=args.preset))
        release()
        save()
    if args.plan_length:
        n = lengths(args.plan_length)[0]
        row = {"length": n, "preset": args.preset, "flags": "?", "fits": False}
        left = PLAN_STEP_TIMEOUT_S if args.full else min(PLAN_STEP_TIMEOUT_S, args.started + QUICK_BUDGET_S - time.monotonic())
        res["plan"] = row | {"error": f"not started: {max(left, 0):.0f} s left of the quick run's {QUICK_BUDGET_S} s"} \
            if left < MIN_STEP_S else guarded(row, plan_step_in_child, n, args.host_memory, args.device, args.preset,
                                              args.gpu_memory, timeout_s=left)
        save()


def errored(res: dict) -> list[dict]:
    """The rows whose benchmark failed (an exception, out of memory, a step process that died or ran out of time)."""
    return [r for r in res["attention"] + res["train"] + [res.get("plan") or {}] if "error" in r]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.started = time.monotonic()  # the quick run's budget counts from here
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible to torch; nothing measured.", file=sys.stderr)
        return 2
    if args.device == "cuda":  # the plan is laid out for this GPU unless --gpu-memory says otherwise
        args.gpu_memory = args.gpu_memory or str(torch.cuda.get_device_properties(0).total_memory)
    if args.plan_step:
        print(json.dumps(bench_plan(args.plan_step, args.host_memory, args.device, args.preset, args.gpu_memory)))
        return 0
    if args.device == "cpu":
        from lcft.train.precision import cpu_describe

        name = f"a CPU, rehearsal only: no figure here is a GPU's ({cpu_describe()})"
    else:
        name = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"device": name, "torch": torch.__version__, "rehearsal": args.device == "cpu", "attention": [], "train": [],
           "tests": {}}

    def save() -> None:  # both files after every step: a run cut short keeps its table so far
        (args.out / "gpu-check.json").write_text(json.dumps(res, indent=1))
        (args.out / "gpu-check.md").write_text(markdown(res))

    try:
        if not args.skip_tests:
            res["tests"] = guarded({"ok": False, "cases": [], "seconds": 0.0}, run_tests, args.out,
                                   args.device == "cuda")
            res["tests"].setdefault("summary", res["tests"].get("error", ""))
        save()
        measure(args, res, save)
    finally:  # the table of whatever ran, even when something outside one benchmark failed
        print(markdown(res), flush=True)
    finite = all(r.get("finite", True) for r in res["attention"] + res["train"] + [res.get("plan") or {}])
    return 0 if res["tests"].get("ok", True) and finite and not errored(res) else 1


if __name__ == "__main__":
    sys.exit(main())
