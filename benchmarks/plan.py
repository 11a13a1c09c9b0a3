"""`lcft plan`'s per-rank estimates against the measured peak RSS of real CPU training runs, one table row per case.

Each case runs `lcft.train.train` for 2 steps (fp32, sparse attention, block checkpointing unless the case names
others, e.g. `lcft train`'s CPU default, dense attention without checkpointing; the default thread count as a user
gets it) in a fresh process that first imports the trainer and runs a small autograd op; the
measured figure is the second step's peak_mem in metrics.jsonl (the busiest rank's VmHWM, its process's
high-water mark) minus that process's RSS after the imports (what no plan counts: Python, torch, lcft). The
second step is the one a plan describes: the first step's backward, its peak, runs before AdamW creates its
moments (8 B per parameter), every later one with them. The first step's figure is kept too. The estimate is
`lcft.plan.estimate` with device cpu. Results go to benchmarks/plan_cases.json (--record; a case recorded before
the second step was measured has steps 1), which tests/plan/test_plan.py checks against the current formulas.
`--quick` runs the tiny preset at 4K only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORD = Path(__file__).with_name("plan_cases.json")
LAYOUTS = {"1 rank": dict(nproc=1, cp=1, shard="none"), "cp 2": dict(nproc=2, cp=2, shard="none"),
           "fsdp 2": dict(nproc=2, cp=1, shard="fsdp")}
CASES = [dict(preset=p, seq_len=n, layout=lay) for p in ("tiny", "small") for n in (16384, 65536, 262144)
         for lay in LAYOUTS] + [dict(preset="tiny", seq_len=524288, layout=lay) for lay in LAYOUTS] + [
    dict(preset="tiny", seq_len=1 << 20, layout="1 rank"),  # 1M on 2 ranks needs more than 24 GiB
    dict(preset="small", seq_len=524288, layout="1 rank"), dict(preset="small", seq_len=524288, layout="cp 2")] + [
    dict(preset="tiny", seq_len=65536, layout=lay, precision="bf16") for lay in ("1 rank", "fsdp 2")] + [
    dict(preset="tiny", seq_len=65536, layout="1 rank", precision="bf16", offload=o) for o in ("exact", "bf16")] + [
    # `lcft train`'s CPU default: dense attention, no checkpointing
    dict(preset=p, seq_len=n, layout=lay, precision=prec, attention="dense", checkpointing="none")
    for p, n, lay, prec in (("tiny", 16384, "1 rank", "fp32"), ("tiny", 65536, "1 rank", "fp32"),
                            ("tiny", 16384, "1 rank", "bf16"), ("small", 16384, "1 rank", "fp32"),
                            ("tiny", 16384, "cp 2", "fp32"), ("tiny", 16384, "fsdp 2", "fp32"),
                            ("tiny", 8192, "1 rank", "fp32"), ("small", 8192, "1 rank", "fp32"),
                            ("tiny", 32768, "1 rank", "fp32"))]
CASE_KEYS = ("preset", "seq_len", "layout", "precision", "offload", "attention", "checkpointing")
"""What names a case (offload: of block inputs); a key a case leaves out has its DEFAULTS value."""
DEFAULTS = {"precision": "fp32", "offload": None, "attention": "sparse", "checkpointing": "block"}
# small 512K on fsdp 2 would need 2 x 18 GiB
QUICK = [dict(preset="tiny", seq_len=4096, layout="1 rank")]
STEPS = 2  # the peak a plan describes is the second step's (AdamW's moments exist from the first step's end)


def spec_of(case: dict) -> dict:
    """The full options of a case: its layout's ranks, cp and shard; sparse, block checkpointing, fp32 unless the
    case says otherwise (attention dense, checkpointing none; bf16: autocast over fp32 weights, under fsdp bf16
    parameters); offload 'exact' or 'bf16': the block inputs offloaded (`--offload-activations`, with
    `--offload-bf16`)."""
    return {**{k: v for k, v in DEFAULTS.items() if v is not None}, **case, **LAYOUTS[case["layout"]]}


def identity(case: dict) -> tuple:
    """What tells two cases apart: every CASE_KEYS value, a left-out key at its default."""
    return tuple(case.get(k, DEFAULTS.get(k)) for k in CASE_KEYS)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    return 0


def child(spec: dict) -> dict:
    """Inside the fresh process: baseline RSS after the imports, then a real run; returns both."""
    import torch

    from lcft.launch import run
    from lcft.train.config import TrainConfig

    x = torch.randn(64, 64, requires_grad=True)  # (64, 64): autograd's and the matmul's first-use state
    (x @ x).sum().backward()
    base = _rss()
    gb = spec["nproc"] // spec["cp"]
    cfg = TrainConfig(data=spec["data"], out=spec["out"], preset=spec["preset"], seq_len=spec["seq_len"], steps=STEPS,
                      global_batch=gb, cp=spec["cp"], nproc=spec["nproc"], checkpointing=spec["checkpointing"],
                      shard=spec.get("shard", "none"), attention=spec.get("attention"),
                      precision=spec.get("precision", "fp32"), save_every=0, warmup=1, progress=False,
                      offload_activations="offload" in spec, offload_bf16=spec.get("offload") == "bf16")
    t0 = time.perf_counter()
    s = run("train", cfg)  # in this process for one rank; several ranks are launched as `lcft train` launches them
    records = [json.loads(line) for line in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    from lcft.plan.plan import cpu_threads

    return {"base": base, "peak": records[-1]["peak_mem"], "first_step_peak": records[0]["peak_mem"],
            "steps": len(records), "threads": cpu_threads(spec["nproc"]), "seconds": time.perf_counter() - t0}


def planned(spec: dict) -> int:
    """`lcft plan --device cpu` for the case's options, in bytes."""
    from lcft.model import preset
    from lcft.plan.estimate import Layout, estimate
    from lcft.plan.plan import cpu_threads

    model = preset(spec["preset"])
    model.attention.backend = spec.get("attention", "dense")
    lay = Layout(spec["seq_len"], world=spec["nproc"], cp=spec["cp"], shard=spec.get("shard", "none"),
                 checkpointing=spec["checkpointing"], precision=spec.get("precision", "fp32"), device="cpu",
                 offload_activations="offload" in spec, offload_bf16=spec.get("offload") == "bf16",
                 threads=spec.get("threads") or cpu_threads(spec["nproc"]))
    return estimate(model, lay).total


def measure(spec: dict, timeout: float = 3600) -> dict:
    """Run one case in a fresh process (threads as a user gets them); {'base', 'peak', 'first_step_peak', ...}."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    p = subprocess.run([sys.executable, __file__, "--case", json.dumps(spec)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"case {spec} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def prepare(root: Path, length: int) -> str:
    from lcft.genomics import prepare_windows, sample_fasta

    out = root / f"w{length}"
    if not out.is_dir():
        # The sample's held-out chr22 piece is 1 Mbp, too short for a 1M window; the runs here never evaluate.
        held_out = ("chr22",) if length < 1 << 20 else ()
        prepare_windows(fasta=str(sample_fasta()), out=str(out), length=length, train=("chr2",), eval=held_out)
    return str(out)


def _row(case: dict, m: dict) -> str:
    from lcft.config import format_size

    got, want = m["peak"] - m["base"], planned({**spec_of(case), "threads": m.get("threads")})
    first = m.get("first_step_peak", m["peak"]) - m["base"]
    return (f"| {case['preset']} | {format_size(case['seq_len'])} | {case['layout']} | "
            f"{_options(case)} | {want / 2**20:,.0f} | {first / 2**20:,.0f} | {m.get('steps', 1)} | "
            f"{got / 2**20:,.0f} | {want / got:.2f} | "
            f"{m['seconds']:.0f} | {m.get('cpu') or _cpu()} |")


def _options(case: dict) -> str:
    """The table's precision cell: the precision, and the offload, attention and checkpointing where not default."""
    spec = spec_of(case)
    out = [spec["precision"]] + (["offload " + case["offload"]] if "offload" in case else [])
    if spec["attention"] != DEFAULTS["attention"]:
        out.append(f"{spec['attention']} attention")
    if spec["checkpointing"] != DEFAULTS["checkpointing"]:
        out.append(f"checkpointing {spec['checkpointing']}")
    return ", ".join(out)


def _name(case: dict) -> str:
    """PRESET:TOKENS:LAYOUT:PRECISION:OFFLOAD:ATTENTION:CHECKPOINTING, what --only matches (an empty OFFLOAD
    for none)."""
    return ":".join("" if v is None else str(v) for v in identity(case))


def _cpu() -> str:
    from lcft.train.precision import cpu_describe

    return cpu_describe()


def _record(case: dict, m: dict) -> None:
    """Add (or replace) one measured case in benchmarks/plan_cases.json."""
    rows = json.loads(RECORD.read_text()) if RECORD.exists() else []
    rows = [r for r in rows if identity(r) != identity(case)]
    rows.append({**case, "base": m["base"], "peak": m["peak"], "first_step_peak": m["first_step_peak"],
                 "steps": m["steps"], "threads": m["threads"], "run_s": round(m["seconds"], 1),
                 "cpu": _cpu()})
    RECORD.write_text(json.dumps(rows, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one tiny case at 4K (about a minute)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only cases whose name starts with this: PRESET:TOKENS:LAYOUT:PRECISION:OFFLOAD:"
                         "ATTENTION:CHECKPOINTING, e.g. 'small:65536:fsdp 2' or 'tiny:16384:1 rank:fp32::dense' "
                         "(repeatable)")
    ap.add_argument("--record", action="store_true", help="write each measured case to benchmarks/plan_cases.json")
    ap.add_argument("--table", action="store_true", help="print the recorded cases against the plan (no runs)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one case may run (default 3600)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(child(json.loads(args.case))))
        return 0
    print("| preset | tokens | layout | precision | planned MiB | first step MiB | steps | measured MiB (last step) | "
          "planned/measured | run s | CPU |")
    print("|---" * 11 + "|")
    if args.table:
        rows = json.loads(RECORD.read_text())
        for r in rows:
            case = {k: r[k] for k in CASE_KEYS if k in r}
            print(_row(case, {**r, "seconds": r.get("run_s", r.get("step_s"))}))
        return 0
    cases = QUICK if args.quick else [c for c in CASES if not args.only or any(
        _name(c).startswith(o) for o in args.only)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, case in enumerate(cases):
            spec = {**spec_of(case), "data": prepare(root, case["seq_len"]), "out": str(root / f"run{i}")}
            m = measure(spec, timeout=args.timeout)
            print(_row(case, m), flush=True)
            if args.record:
                _record(case, m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
