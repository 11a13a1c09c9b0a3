"""What a process lcft starts pays before its work: `python -c "import X"` for each entry point (the CLI, a launched
worker, the trainer, the evaluator, the export, the plan), then a fresh `lcft eval` and `lcft export` of a plain
checkpoint (a 2-block model, 2 windows) and a 1-step `lcft train` from it. Each in a fresh interpreter: median wall
time of --repeat runs, CPU time and peak RSS, and which heavy modules it imported (torch._dynamo, torch.distributed's
checkpoint, tensor and FSDP, sympy: none of them needed by a plain run).

`--against DIR` runs the same entries with the lcft of another checkout (an older commit, say) too, alternating,
and prints both side by side with the modules DIR's lcft imports and this one no longer does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WATCHED = ("torch", "torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.tensor",
           "torch.distributed.fsdp", "sympy", "numpy", "accelerate", "transformers", "matplotlib")
# argv[1]: a module to import, or "cli" and the command line to run; prints what it imported and its CPU time
RUN = f"WATCHED = {WATCHED!r}" + """
import json, resource, sys
if sys.argv[1] == "cli":
    from lcft.cli.app import app
    try:
        app(sys.argv[2:])
    except SystemExit as e:
        assert not e.code, e.code
else:
    __import__(sys.argv[1])
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": use.ru_utime + use.ru_stime, "rss_kib": use.ru_maxrss,
                  "mods": [m for m in WATCHED if m in sys.modules]}))
"""
IMPORTS = {
    "lcft.cli.app": "every `lcft` command, --help",
    "lcft.launch.__main__": "a launched worker, before its job",
    "lcft.train.trainer": "lcft train, a train worker",
    "lcft.evaluate.runner": "lcft eval, an eval worker",
    "lcft.checkpoint.export": "lcft export",
    "lcft.plan": "lcft plan's estimates",
}
SETUP = """
import sys, torch
from pathlib import Path
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.genomics import prepare_windows, sample_fasta
from lcft.model import Llama, LlamaConfig
root = Path(sys.argv[1])
prepare_windows(fasta=str(sample_fasta()), out=str(root / "data"), length=2048, train=("chr2",), eval=("chr22",),
                max_n_frac=0.6)
torch.manual_seed(0)
save_pretrained(Llama(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=2)), root / "model")
"""


def once(tree: Path, argv: list[str], work: Path) -> dict:
    """One fresh interpreter importing tree's lcft: its wall time, CPU time, peak RSS and watched modules."""
    env = os.environ | {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, env=env, cwd=work)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"{tree}: {' '.join(argv)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return {"wall": wall, **json.loads(r.stdout.strip().splitlines()[-1])}


def entries(work: Path) -> dict[str, Callable[[str], list[str]]]:
    """name -> a function of the run number giving that run's argv (eval and export write a new folder each run)."""
    out: dict[str, Callable[[str], list[str]]] = {f"import {m} ({what})": (lambda i, m=m: [m]) for m, what in IMPORTS.items()}
    data, model = work / "data", work / "model"
    out["lcft eval, a plain checkpoint, 2 windows"] = lambda i: [
        "cli", "eval", "--data", str(data), "-c", str(model), "--out", str(work / f"eval-{i}"), "--max-windows", "2",
        "--bootstrap", "1", "--quiet", "--no-progress"]
    out["lcft export, a plain checkpoint"] = lambda i: ["cli", "export", str(model), "--out", str(work / f"export-{i}")]
    # (torch.optim's first param group imports torch._dynamo, and with it DTensor and FSDP: a train still does)
    out["lcft train, 1 step of 512 tokens"] = lambda i: [
        "cli", "train", "--data", str(data), "--init", str(model), "--out", str(work / f"train-{i}"), "--seq-len", "512",
        "--global-batch", "1", "--steps", "1", "--warmup", "0", "--precision", "fp32", "--no-progress"]
    return out


def cell(runs: list[dict]) -> str:
    return (f"{statistics.median(r['wall'] for r in runs):.2f} / {statistics.median(r['cpu'] for r in runs):.2f} / "
            f"{max(r['rss_kib'] for r in runs) / 1024:.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 runs of each")
    ap.add_argument("--against", type=Path, help="another checkout whose lcft runs the same entries")
    args = ap.parse_args()
    repeat = 3 if args.quick else args.repeat
    trees = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.machine())
    print(f"{cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; Python "
          f"{platform.python_version()}, bytecode {'not ' if sys.dont_write_bytecode else ''}written; median of "
          f"{repeat} fresh interpreters each, alternating; wall s / CPU s / peak RSS MiB")
    with tempfile.TemporaryDirectory(prefix="lcft-start-") as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-c", SETUP, str(work)], check=True, env=os.environ | {"PYTHONPATH": str(ROOT)},
                       capture_output=True)
        if args.against:
            print(f"before: {trees['against']}; after: {ROOT}\n")
            print("| entry | before | after | CPU before/after | no longer imported |\n|---|---|---|---|---|")
        else:
            print("| entry | wall / CPU / RSS | imports (of the watched) |\n|---|---|---|")
        for name, argv in entries(work).items():
            got: dict[str, list[dict]] = {side: [] for side in trees}
            for i in range(repeat):
                for side, tree in trees.items():
                    got[side].append(once(tree, argv(f"{side}-{i}"), work))
            mods = {side: set(runs[-1]["mods"]) for side, runs in got.items()}
            if args.against:
                gone = [m for m in WATCHED if m in mods["against"] - mods["this"]]
                ratio = statistics.median(r["cpu"] for r in got["against"]) / statistics.median(r["cpu"] for r in got["this"])
                print(f"| {name} | {cell(got['against'])} | {cell(got['this'])} | {ratio:.2f}x | {', '.join(gone) or '-'} |")
            else:
                print(f"| {name} | {cell(got['this'])} | {', '.join(m for m in WATCHED if m in mods['this'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
