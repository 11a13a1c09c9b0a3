"""`lcft plan`'s CPU figures against measurements: real CPU runs (fresh, within 25%; recorded in
benchmarks/plan_cases.json, within the plan's bounds), the chunked kernel's own allocations, and how
benchmarks/plan.py names and records a case."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from lcft.kernels.sparse_cpu import sparse_attention_cpu
from lcft.model import LlamaConfig, preset
from lcft.parallel.cp_attention import dense_indices
from lcft.plan.estimate import (
    GLIBC_MMAP_CEILING,
    Layout,
    activation_bytes,
    heap_kept_gradients,
    kernel_chunk_bytes,
)
from lcft.plan.shape import Shape

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "plan.py"
RECORDED = json.loads((BENCH.parent / "plan_cases.json").read_text())
_spec = importlib.util.spec_from_file_location("plan_bench", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # benchmarks/plan.py: the same child and cases the benchmark table uses


@pytest.mark.slow
@pytest.mark.parametrize("case", [("tiny", 2048, "none"), ("tiny", 2048, "block")])
def test_estimate_within_25_percent_of_measured_rss(case: tuple[str, int, str], tmp_path: Path) -> None:
    """A real 2-step CPU run in a fresh process: peak RSS above the post-import baseline against the plan."""
    name, seq, ck = case
    spec = {"preset": name, "seq_len": seq, "cp": 1, "nproc": 1, "checkpointing": ck,
            "data": bench.prepare(tmp_path, seq), "out": str(tmp_path / "run")}
    m = bench.measure(spec, timeout=600)
    measured, planned = m["peak"] - m["base"], bench.planned({**spec, "threads": m["threads"]})  # the child's
    assert abs(planned / measured - 1) <= 0.25, (planned, measured)


@pytest.mark.parametrize("case", RECORDED, ids=lambda c: bench._name(c).replace(":", "-"))
def test_recorded_cpu_runs_stay_within_the_plans_bounds(case: dict) -> None:
    """The measured peak of every recorded run (benchmarks/plan_cases.json; a later step's, as a plan describes)
    against today's formulas: within 10%, and never more than 5% under the measurement."""
    assert case["steps"] >= 2, case  # a first step peaks before AdamW's moments exist
    spec = bench.spec_of({k: case[k] for k in bench.CASE_KEYS if k in case})
    planned = bench.planned({**spec, "threads": case["threads"]})  # the run's threads, not this machine's
    ratio = planned / (case["peak"] - case["base"])
    assert ratio >= 0.95, ratio  # never more than 5% under the measurement
    assert ratio <= 1.10, ratio


def test_bench_child_is_importable() -> None:
    p = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "peak RSS" in p.stdout


def test_a_case_names_its_attention_and_checkpointing() -> None:
    """A case that names them is planned (and run) with them; one that does not keeps sparse, block."""
    dense = bench.spec_of({"preset": "tiny", "seq_len": 16384, "layout": "cp 2", "attention": "dense",
                           "checkpointing": "none"})
    assert (dense["attention"], dense["checkpointing"], dense["cp"], dense["nproc"]) == ("dense", "none", 2, 2)
    plain = bench.spec_of({"preset": "tiny", "seq_len": 16384, "layout": "1 rank"})
    assert (plain["attention"], plain["checkpointing"], plain["precision"]) == ("sparse", "block", "fp32")
    assert bench.planned({**dense, "threads": 1}) != bench.planned({**dense, "threads": 1, "checkpointing": "block"})


def test_recording_a_case_replaces_that_case_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case recorded again replaces its own row, not the rows of cases that differ from it only in a key it
    leaves at its default (precision, attention, checkpointing)."""
    base = {"preset": "tiny", "seq_len": 16384, "layout": "1 rank"}
    rows = [{**base, **extra, "peak": 1} for extra in ({}, {"precision": "bf16"},
                                                       {"attention": "dense", "checkpointing": "none"})]
    record = tmp_path / "cases.json"
    record.write_text(json.dumps(rows))
    monkeypatch.setattr(bench, "RECORD", record)
    bench._record(dict(base), {"base": 0, "peak": 2, "first_step_peak": 2, "steps": 2, "threads": 1,
                               "seconds": 1.0})
    got = json.loads(record.read_text())
    assert sorted((bench._name(r), r["peak"]) for r in got) == sorted(
        [(bench._name(base), 2)] + [(bench._name(r), 1) for r in rows[1:]])


@pytest.mark.parametrize("name", ["tiny", "small", "qwen3", "mixtral"])
def test_the_heap_keeps_the_gradients_under_glibcs_mmap_ceiling(name: str) -> None:
    """On CPU without checkpointing below 64K the transient adds one block's gradient buffers under the ceiling:
    all of them where every buffer is small, none where every one is over it, nothing on CUDA or checkpointed."""
    cfg = {"qwen3": LlamaConfig(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=48, qk_norm=True, model_type="qwen3"),
           "mixtral": LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                  model_type="mixtral")}.get(name) or preset(name)
    shape = Shape.of(cfg)
    for a, r in ((4, 4), (2, 4), (2, 2)):
        assert sum(w * k for w, k in shape.saved_buffers(a, r)) == shape.saved_bytes(a, r)
    short = Layout(2048, checkpointing="none", device="cpu", precision="fp32")
    assert heap_kept_gradients(shape, short) == shape.saved_bytes(4, 4) * 2048
    smallest = min(w for w, _ in shape.saved_buffers(4, 4)) * 2048
    big = Layout(2048, micro_batch=-(-GLIBC_MMAP_CEILING // smallest), checkpointing="none", device="cpu",
                 precision="fp32")  # every buffer at the ceiling or over it
    assert heap_kept_gradients(shape, big) == 0
    for lay in (short, Layout(16384, checkpointing="none", device="cpu", precision="bf16")):
        cuda = activation_bytes(shape, Layout(lay.seq_len, checkpointing="none", precision=lay.precision))
        assert activation_bytes(shape, lay)[1] - cuda[1] == heap_kept_gradients(shape, lay)


def test_the_kernels_chunk_buffers_against_its_own_allocations() -> None:
    """Dense attention under cp 2 (every earlier key block of the window read): the planned chunk buffers
    against the peak of the bytes the kernel allocates in forward and backward (the profiler's count), less its
    output and gradients and the fp32 K/V gradient accumulators the plan counts elsewhere."""
    lq, lk, heads, d, block = 1024, 2048, 4, 64, 64
    cfg = LlamaConfig(hidden_size=heads * d, intermediate_size=512, num_hidden_layers=1, num_attention_heads=heads,
                      num_key_value_heads=heads)
    planned = kernel_chunk_bytes(Shape.of(cfg), Layout(lk, world=2, cp=2, device="cpu", precision="fp32"))
    q = torch.randn(1, heads, lq, d, requires_grad=True)  # (B, Hq, L/cp, D)
    k, v = (torch.randn(1, heads, lk, d, requires_grad=True) for _ in range(2))  # (B, Hkv, L, D)
    indices = dense_indices(1, heads, lq // block, lk // block - lq // block, q.device).contiguous()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = sparse_attention_cpu(q, k, v, indices, block_size=block, q_block_offset=lk // block - lq // block)
        out.backward(torch.ones_like(out))
    peak = max(_running_totals(prof))
    elsewhere = 2 * q.numel() * 4 + 4 * k.numel() * 4  # out, dq; dk, dv and their fp32 accumulators
    assert peak - elsewhere <= planned <= 1.25 * (peak - elsewhere), (planned, peak - elsewhere)


def _running_totals(prof: torch.profiler.profile) -> list[int]:
    """The profiler's running count of allocated CPU bytes at each allocation and free, from its first event."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return [m["Total Allocated"] - start for m in memory]
