"""gpu_check.py's 1M step: the layout `lcft plan` picks for one GPU and this node's host memory, run in its own process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gpu_check_table import GIB
from gpu_check_train import bench_train

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = Path(__file__).resolve().with_name("gpu_check.py")  # its hidden --plan-step runs bench_plan in a child
H200_MEMORY = "141GB"  # an H200's: the layout the docs and the CPU tests quote (a run plans for its own GPU's)
NOTHING_FITS = "(nothing fits)"  # plan_for_one_gpu's flags when no layout fits
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1
PLAN_STEP_TIMEOUT_S = 200  # the 1M step's process (its model built, 88-176 GiB offloaded and back, one step)


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

    _, model, lay = _plan_inputs(length, None, preset, H200_MEMORY)
    block = estimate(model, with_changes(lay, checkpointing="block")).total
    offloaded = estimate(model, with_changes(lay, checkpointing="block", offload_activations=True)).total
    assert offloaded < block, (length, preset, offloaded, block)  # offloading must free something at this length
    return (block + offloaded) // 2


def plan_for_one_gpu(length: int, host_memory: str, preset: str = "1b",
                     gpu_memory: str = H200_MEMORY) -> tuple[str, object, object]:
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


def gpu_memory_label(gpu_memory: str) -> str:
    """The plan's GPU memory as the table names it: '141GB' -> '141 GB' (the unit given), bytes -> GiB."""
    from lcft.plan.config import parse_bytes

    if gpu_memory.strip().isdigit():
        return f"{parse_bytes(gpu_memory) / GIB:.1f} GiB"
    return re.sub(r"^([0-9.]+)\s*", r"\1 ", gpu_memory.strip())


def _plan_row(length: int, host_memory: str, preset: str, gpu_memory: str) -> tuple[dict, object]:
    """The plan's figures as a row, and its Layout (None when no layout fits: the row then says so)."""
    from lcft.plan.config import parse_bytes

    flags, lay, est = plan_for_one_gpu(length, host_memory, preset, gpu_memory)
    row = {"length": length, "preset": preset, "flags": flags, "plan_gib": est.total / GIB, "host_gib": est.host / GIB,
           "gpu_memory": gpu_memory_label(gpu_memory)}
    if flags != NOTHING_FITS:
        return row, lay
    return row | {"fits": False, "no_layout": f"no layout fits on this GPU ({row['gpu_memory']}) and "
                                              f"{parse_bytes(host_memory) / GIB:.0f} GiB of host memory"}, None


def bench_plan(length: int, host_memory: str, device: str = "cuda", preset: str = "1b",
               gpu_memory: str = H200_MEMORY) -> dict:
    """One `preset` step at `length` with the settings `lcft plan` picks for one GPU and this node's host memory:
    fits or not, peak vs the plan (device cpu: the rehearsal of the same code)."""
    import torch

    row, lay = _plan_row(length, host_memory, preset, gpu_memory)
    if lay is None:
        return row
    total = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else node_memory()
    row |= {"gpu_gib": total / GIB}
    flags = row["flags"]
    if lay.cp != 1 or lay.micro_batch != 1 or lay.shard != "none":
        return row | {"error": f"does not fit: the plan needs more than one GPU ({flags})"}
    try:
        got = bench_train(length, lay.checkpointing, lay.offload_activations, warmup=False, device=device,
                          preset=preset, offload_bf16=lay.offload_bf16)
        from lcft.train.metrics import peak_memory_bytes

        host_peak = peak_memory_bytes(torch.device("cpu")) / GIB  # this process's VmHWM: the plan's host need
        return row | {"fits": True, "host_peak_gib": host_peak, **{k: got[k] for k in ("step_s", "peak_gib", "finite")}}
    except torch.OutOfMemoryError as e:
        return row | {"fits": False, "error": f"does not fit: out of memory: {str(e).splitlines()[0][:80]}"}


def plan_step_in_child(length: int, host_memory: str, device: str = "cuda", preset: str = "1b",
                       gpu_memory: str = H200_MEMORY, timeout_s: float | None = None) -> dict:
    """bench_plan in a fresh process: at 1M the plan offloads 88-176 GiB of block inputs to host memory, and a process
    the kernel kills for running out of it must not take the rest of the run's results with it. When `lcft plan`
    finds no layout for this GPU, that row, and no process started. timeout_s: its limit (PLAN_STEP_TIMEOUT_S)."""
    row, lay = _plan_row(length, host_memory, preset, gpu_memory)
    if lay is None:
        return row
    timeout_s = PLAN_STEP_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        res = subprocess.run([sys.executable, str(GPU_CHECK), "--plan-step", str(length), "--host-memory", host_memory,
                              "--device", device, "--preset", preset, "--gpu-memory", gpu_memory],
                             capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    except subprocess.TimeoutExpired:  # e.g. a host swapping the offloaded block inputs
        return row | {"fits": False, "error": f"its process ran past {timeout_s:.3g} s and was stopped"}
    lines = res.stdout.strip().splitlines()
    if res.returncode == 0 and lines:
        return json.loads(lines[-1])
    why = f"killed by signal {-res.returncode}" if res.returncode < 0 else f"exit {res.returncode}"
    last = (res.stderr.strip().splitlines() or [""])[-1][:120]
    return row | {"fits": False,
                  "error": f"its process ended ({why}{', host memory?' if res.returncode == -9 else ''}): {last}"}
