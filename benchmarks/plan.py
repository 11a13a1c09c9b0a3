"""`lcft plan`'s per-rank estimates against the measured peak RSS of real CPU training runs, one table row per case.

Each case runs `lcft.train.train` (2 steps, fp32, 1 thread per process) in a fresh process that first imports the
trainer and runs a small autograd op; the measured figure is the peak RSS of the busiest rank (metrics.jsonl's
peak_mem) minus that process's RSS after the imports (what no plan counts: Python, torch, lcft). The estimate
is `lcft.plan.estimate` with device cpu. `--quick` runs the tiny preset at 2K-4K only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [  # (preset, seq_len, cp, nproc, checkpointing)
    ("tiny", 2048, 1, 1, "none"), ("tiny", 4096, 1, 1, "none"), ("tiny", 8192, 1, 1, "none"),
    ("tiny", 4096, 1, 1, "block"), ("tiny", 8192, 1, 1, "block"), ("tiny", 16384, 1, 1, "block"),
    ("tiny", 4096, 2, 2, "none"), ("tiny", 8192, 2, 2, "block"), ("tiny", 4096, 1, 2, "none"),
    ("small", 2048, 1, 1, "none"), ("small", 4096, 1, 1, "block"), ("small", 8192, 2, 2, "block"),
]
QUICK = [("tiny", 2048, 1, 1, "none"), ("tiny", 4096, 1, 1, "block")]


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    return 0


def child(spec: dict) -> dict:
    """Inside the fresh process: baseline RSS after the imports, then a real run; returns both."""
    import torch

    from lcft.train.config import TrainConfig
    from lcft.train.trainer import train

    torch.set_num_threads(1)
    x = torch.randn(64, 64, requires_grad=True)  # (64, 64): autograd's and the matmul's first-use state
    (x @ x).sum().backward()
    base = _rss()
    gb = spec["nproc"] // spec["cp"]
    cfg = TrainConfig(data=spec["data"], out=spec["out"], preset=spec["preset"], seq_len=spec["seq_len"], steps=2,
                      global_batch=gb, cp=spec["cp"], nproc=spec["nproc"], checkpointing=spec["checkpointing"],
                      precision="fp32", save_every=0, warmup=1, progress=False)
    t0 = time.perf_counter()
    s = train(cfg)
    records = [json.loads(line) for line in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return {"base": base, "peak": max(r["peak_mem"] for r in records), "seconds": time.perf_counter() - t0}


def planned(spec: dict) -> int:
    from lcft.model import preset
    from lcft.plan.estimate import Layout, estimate

    lay = Layout(spec["seq_len"], world=spec["nproc"], cp=spec["cp"], checkpointing=spec["checkpointing"],
                 precision="fp32", device="cpu")
    return estimate(preset(spec["preset"]), lay).total


def measure(spec: dict, timeout: float = 1800) -> dict:
    """Run one case in a fresh process (OMP_NUM_THREADS=1); {'base', 'peak', 'seconds'}."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, __file__, "--case", json.dumps(spec)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"case {spec} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def prepare(root: Path, length: int) -> str:
    from lcft.genomics import prepare_windows, sample_fasta

    out = root / f"w{length}"
    if not out.is_dir():
        prepare_windows(fasta=str(sample_fasta()), out=str(out), length=length, train=("chr2",), eval=("chr22",))
    return str(out)


# Published shapes a user would continue (dims as in their config.json; vocabularies as their tokenizers).
SHAPED = {
    "1b preset": dict(),
    "GENERator-3B-shaped": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=4128),
    "7B Llama-shaped": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=32, vocab_size=1024),
}


def _min_cp(model, seq: int, budget: int, **kw) -> str:
    """The smallest cp (of 1, 2, 4, 8 on 8 GPUs) at which a block-checkpointed layout fits, with its GiB."""
    from lcft.plan.estimate import GIB, Layout, estimate

    for cp in (1, 2, 4, 8):
        for kv in (("all",) if cp == 1 else ("all", "stream")):
            est = estimate(model, Layout(seq, world=8, cp=cp, checkpointing="block", cp_kv=kv, **kw))
            if est.total <= budget:
                return f"cp {cp}{' stream' if kv == 'stream' else ''} ({est.total / GIB:.0f} GiB)"
    return "does not fit"


def readme_table() -> str:
    """Markdown: for each shape, length and GPU, the smallest cp that fits under DDP, FSDP, FSDP + offload."""
    from lcft.model import LlamaConfig, preset
    from lcft.plan.config import parse_bytes

    rows = ["| model | tokens | GPUs | --shard none | --shard fsdp | fsdp + --offload-params |",
            "|---|---|---|---|---|---|"]
    for label, dims in SHAPED.items():
        model = preset("1b") if not dims else LlamaConfig(rope_theta=1e6, **dims)
        for seq in (512 << 10, 1 << 20):
            for gpu in ("80GiB", "141GB"):
                budget = parse_bytes(gpu)
                cells = [_min_cp(model, seq, budget), _min_cp(model, seq, budget, shard="fsdp"),
                         _min_cp(model, seq, budget, shard="fsdp", offload_params=True)]
                rows.append(f"| {label} | {seq >> 10}K | 8 x {gpu} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two tiny cases (about a minute)")
    ap.add_argument("--readme", action="store_true", help="print the README's GPU table (no runs)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(child(json.loads(args.case))))
        return 0
    if args.readme:
        print(readme_table())
        return 0
    from lcft.train.precision import cpu_describe

    print(f"CPU: {cpu_describe()}; fp32, 2 steps, 1 thread per process")
    print("| preset | tokens | cp | ranks | checkpointing | planned MiB | measured MiB | planned/measured | step s |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (name, seq, cp, nproc, ck) in enumerate(QUICK if args.quick else CASES):
            spec = {"preset": name, "seq_len": seq, "cp": cp, "nproc": nproc, "checkpointing": ck,
                    "data": prepare(root, max(seq, 4096)), "out": str(root / f"run{i}")}
            m = measure(spec)
            got, want = m["peak"] - m["base"], planned(spec)
            ratio = want / got
            worst = max(worst, abs(ratio - 1))
            print(f"| {name} | {seq // 1024}K | {cp} | {nproc} | {ck} | {want / 2**20:,.0f} | {got / 2**20:,.0f} | "
                  f"{ratio:.2f} | {m['seconds'] / 2:.1f} |", flush=True)
    print(f"largest deviation: {worst:.0%} (bound 25%)")
    return 0 if worst <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
