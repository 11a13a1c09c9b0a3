"""gpu_check.py's 1M step: the layout `lcft plan` picks for one GPU and this node's host memory, run in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpu_check_table import GIB
from gpu_check_train import bench_train

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = Path(__file__).resolve().with_name("gpu_check.py")  # its hidden --plan-step runs bench_plan in a child
PLAN_GPU_MEMORY = "141GB"  # the 1M run is laid out for one GPU of this size
NOTHING_FITS = "(nothing fits)"  # plan_for_one_gpu's flags when no layout fits
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1
PLAN_STEP_TIMEOUT_S = 240  # the 1M step's process (its model built, 88-176 GiB offloaded and back, one step)


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
    from lcft.config_build import resolve
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
        res = subprocess.run([sys.executable, str(GPU_CHECK), "--plan-step", str(length), "--host-memory", host_memory,
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
