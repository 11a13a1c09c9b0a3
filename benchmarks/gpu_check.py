"""One-GPU check: `pytest -m gpu`, Triton sparse vs flash attention, 1b-preset steps, 1M tokens as `lcft plan` lays them.

Prints one markdown table (also <out>/gpu-check.md; the numbers in <out>/gpu-check.json). Exits 1 on a failed or
skipped GPU test or a non-finite benchmark output, 0 otherwise (a missed target shows in the table, not in the exit
code). Without CUDA it says so and exits 2 (nothing measured). Run by `make gpu-check` (benchmarks/gpu_check.sh),
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
from gpu_check_table import GIB, markdown  # noqa: E402

from lcft.config import parse_size  # noqa: E402 (standard library only; the path above finds lcft)

# Dense bf16 tensor-core peak, FLOP/s, by device-name fragment, the first that matches (MFU denominator): NVIDIA's
# data sheets halve their with-sparsity figures (H200 NVL 1,671 -> 835; H100 PCIe 1,513 -> 756; SXM 1,979 -> 989).
PEAK_BF16 = {"H200 NVL": 835e12, "H100 PCIe": 756e12, "H200": 989e12, "H100": 989e12, "A100": 312e12,
             "B200": 2250e12, "L40S": 362e12, "4090": 165e12}
PLAN_GPU_MEMORY = "141GB"  # the 1M run is laid out for one GPU of this size
NOTHING_FITS = "(nothing fits)"  # plan_for_one_gpu's flags when no layout fits
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1
TESTS_TIMEOUT_S = 300  # pytest -m gpu (about 2 minutes on an H100/H200 with a cold Triton cache: docs/cuda.md)
PLAN_STEP_TIMEOUT_S = 240  # the 1M step's process (its model built, 88-176 GiB offloaded and back, one step)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-check-out", help="folder of the JSON and markdown")
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
                    help=f"one GPU's memory the plan step is laid out for (default {PLAN_GPU_MEMORY}; on cpu just "
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
    args.gpu_memory = args.gpu_memory or PLAN_GPU_MEMORY
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
    try:
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", str(ROOT / "tests" / "gpu"),
                              f"--junitxml={xml}"], capture_output=True, text=True, cwd=ROOT, timeout=TESTS_TIMEOUT_S)
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
    t_s = timed(lambda: torch.autograd.grad(
        sparse_attention_with_indices(q, k, v, idx, block_size=BLOCK, impl="triton"), (q, k, v), dout), repeat,
        device)
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


def bench_train(length: int, checkpointing: str = "block", offload: bool = False, warmup: bool = True,
                device: str = "cuda", preset: str = "1b", offload_bf16: bool = False) -> dict:
    """A `preset` step (sparse attention, chunked CE, bf16 autocast, AdamW): time, tokens/s, MFU, peak memory.
    With warmup, the second step is timed; without it the first (the optimizer state's allocation included).
    offload_bf16: the offloaded block inputs in bf16 (`--offload-bf16`)."""
    import torch
    from attention_gpu import FLOPS_PER_PAIR, sparse_pairs

    import lcft.model as lm
    from lcft.kernels import SparseSpec, chunked_cross_entropy
    from lcft.parallel.activations import apply_activation_checkpointing
    from lcft.train.memory import expandable_cuda_segments, return_freed_buffers_to_os
    from lcft.train.metrics import peak_memory_bytes

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = lm.preset(preset)
    cfg.vocab_size = 16
    cfg.attention = lm.AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=128, top_k=16))
    torch.manual_seed(0)
    model = lm.Llama(cfg).to(device)
    return_freed_buffers_to_os(length)  # the allocators as `lcft train` sets them for this window
    expandable_cuda_segments(length)
    apply_activation_checkpointing(model, checkpointing, offload=offload,
                                   offload_dtype=torch.bfloat16 if offload_bf16 else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(4, 8, (1, length), device=device)
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100, device=device)], 1)

    def step() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss_sum, count = chunked_cross_entropy(model.hidden_states(ids), model.lm_head_weight, labels)
        loss = loss_sum / count
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0, loss.item()

    if warmup:
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds, loss = step()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    attn = FLOPS_PER_PAIR * cfg.num_hidden_layers * heads * d * sparse_pairs(length, 128, cfg.attention.sparse.budget)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = next((v for fragment, v in PEAK_BF16.items() if fragment in name), None)
    row = {"length": length, "preset": preset, "step_s": seconds, "tokens_per_s": length / seconds, "loss": loss,
           "offload": ("bf16" if model.offload_dtype == torch.bfloat16 else "exact") if model.offload else "none",
           "finite": loss == loss and abs(loss) != float("inf"),
           "mfu": (6 * n_params * length + attn) / seconds / peak if peak else None,
           "peak_gib": peak_memory_bytes(torch.device(device)) / GIB}
    print(json.dumps(row), flush=True)
    return row


def node_memory() -> int:
    """The host memory this process may use, bytes: the machine's physical memory, or its container's limit when
    lower (a cgroup's memory.max; `max` = none)."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for path in CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits)


def _plan_inputs(length: int, host_memory: str | None, preset: str, gpu_memory: str) -> tuple[object, object, object]:
    """(PlanConfig, LlamaConfig, Layout) of `lcft plan` for one GPU: sparse attention, `length` tokens."""
    from lcft.config import resolve
    from lcft.plan.config import PlanConfig
    from lcft.plan.plan import layout, model_config

    cfg = resolve(PlanConfig, None, {"preset": preset, "attention": "sparse", "seq_len": length,
                                     "gpu_memory": gpu_memory, "host_memory": host_memory})
    model = model_config(cfg)
    return cfg, model, layout(cfg, model)


def offload_budget(length: int, preset: str) -> int:
    """GPU bytes halfway between what `preset` at `length` needs with block checkpointing and with its block inputs
    offloaded too: a plan for that GPU picks `--checkpointing block --offload-activations`, as the 1M run's does."""
    from lcft.plan.estimate import estimate
    from lcft.plan.plan import with_changes

    _, model, lay = _plan_inputs(length, None, preset, PLAN_GPU_MEMORY)
    block = estimate(model, with_changes(lay, checkpointing="block")).total
    offloaded = estimate(model, with_changes(lay, checkpointing="block", offload_activations=True)).total
    assert offloaded < block, (length, preset, offloaded, block)  # offloading must free something at this length
    return (block + offloaded) // 2


def plan_for_one_gpu(length: int, host_memory: str, preset: str = "1b",
                     gpu_memory: str = PLAN_GPU_MEMORY) -> tuple[str, object, object]:
    """What `lcft plan --preset P --attention sparse --seq-len L --gpu-memory G --host-memory H` picks: the
    layout as given when it fits, else its first fitting change set; (flags, Layout, Estimate)."""
    from lcft.plan.estimate import estimate
    from lcft.plan.plan import Budget, pick

    cfg, model, lay = _plan_inputs(length, host_memory, preset, gpu_memory)
    picked = pick(model, lay, Budget.of(cfg))
    if picked is None:
        return NOTHING_FITS, lay, estimate(model, lay)
    flags, lay, est = picked
    return flags or "(as given)", lay, est


def bench_plan(length: int, host_memory: str, device: str = "cuda", preset: str = "1b",
               gpu_memory: str = PLAN_GPU_MEMORY) -> dict:
    """One `preset` step at `length` with the settings `lcft plan` picks for one GPU and this node's host memory:
    fits or not, peak vs the plan (device cpu: the rehearsal of the same code)."""
    import torch

    flags, lay, est = plan_for_one_gpu(length, host_memory, preset, gpu_memory)
    total = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else node_memory()
    row = {"length": length, "preset": preset, "flags": flags, "plan_gib": est.total / GIB, "host_gib": est.host / GIB,
           "gpu_gib": total / GIB}
    if flags == NOTHING_FITS:
        from lcft.plan.config import parse_bytes

        return row | {"fits": False, "error": f"lcft plan fits no layout in one GPU and "
                                              f"{parse_bytes(host_memory) / GIB:.0f} GiB of host memory"}
    if lay.cp != 1 or lay.micro_batch != 1 or lay.shard != "none":
        return row | {"error": f"the plan needs more than one GPU ({flags})"}
    try:
        got = bench_train(length, lay.checkpointing, lay.offload_activations, warmup=False, device=device,
                          preset=preset, offload_bf16=lay.offload_bf16)
        from lcft.train.metrics import peak_memory_bytes

        host_peak = peak_memory_bytes(torch.device("cpu")) / GIB  # this process's VmHWM: the plan's host need
        return row | {"fits": True, "host_peak_gib": host_peak, **{k: got[k] for k in ("step_s", "peak_gib", "finite")}}
    except torch.OutOfMemoryError as e:
        return row | {"fits": False, "error": f"out of memory: {str(e).splitlines()[0][:80]}"}


def plan_step_in_child(length: int, host_memory: str, device: str = "cuda", preset: str = "1b",
                       gpu_memory: str = PLAN_GPU_MEMORY) -> dict:
    """bench_plan in a fresh process: at 1M the plan offloads 88-176 GiB of block inputs to host memory, and a process
    the kernel kills for running out of it must not take the rest of the run's results with it."""
    def failed(error: str) -> dict:  # the plan's figures beside why no step result came back
        flags, _, est = plan_for_one_gpu(length, host_memory, preset, gpu_memory)
        return {"length": length, "flags": flags, "plan_gib": est.total / GIB, "host_gib": est.host / GIB,
                "fits": False, "error": error}

    try:
        res = subprocess.run([sys.executable, __file__, "--plan-step", str(length), "--host-memory", host_memory,
                              "--device", device, "--preset", preset, "--gpu-memory", gpu_memory],
                             capture_output=True, text=True, cwd=ROOT, timeout=PLAN_STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # e.g. a host swapping the offloaded block inputs
        return failed(f"its process ran past {PLAN_STEP_TIMEOUT_S} s and was stopped")
    lines = res.stdout.strip().splitlines()
    if res.returncode == 0 and lines:
        return json.loads(lines[-1])
    why = f"killed by signal {-res.returncode}" if res.returncode < 0 else f"exit {res.returncode}"
    last = (res.stderr.strip().splitlines() or [""])[-1][:120]
    return failed(f"its process ended ({why}{', host memory?' if res.returncode == -9 else ''}): {last}")


def measure(args: argparse.Namespace, res: dict, save) -> None:
    """Every benchmark of the run into `res`, each in its own CUDA memory (the cache emptied between them), `save()`
    after each, so a run cut short keeps what it measured; the 1M plan step in its own process."""
    import torch

    res |= {"attention": [], "train": []}
    for n in lengths(args.attention):
        res["attention"].append(bench_attention(n, args.repeat, lengths(args.dense_max)[0], args.device))
        torch.cuda.empty_cache()
        save()
    for n in lengths(args.train):
        try:
            res["train"].append(bench_train(n, device=args.device, preset=args.preset))
        except torch.OutOfMemoryError as e:
            res["train"].append({"length": n, "error": f"out of memory: {str(e).splitlines()[0][:80]}"})
        torch.cuda.empty_cache()
        save()
    if args.plan_length:
        gc.collect()  # nothing of this process's own runs left on the GPU beside the child
        torch.cuda.empty_cache()
        res["plan"] = plan_step_in_child(lengths(args.plan_length)[0], args.host_memory, args.device, args.preset,
                                         args.gpu_memory)
        save()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible to torch; nothing measured.", file=sys.stderr)
        return 2
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
           "tests": {} if args.skip_tests else run_tests(args.out, args.device == "cuda")}

    def save() -> None:  # both files after every step: a run cut short keeps its table so far
        (args.out / "gpu-check.json").write_text(json.dumps(res, indent=1))
        (args.out / "gpu-check.md").write_text(markdown(res))

    save()
    measure(args, res, save)
    print(markdown(res))
    finite = all(r.get("finite", True) for r in res["attention"] + res["train"] + [res.get("plan") or {}])
    broken = res["rehearsal"] and "error" in (res.get("plan") or {})  # on CPU the step cannot miss: a failure is a bug
    return 0 if res["tests"].get("ok", True) and finite and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
