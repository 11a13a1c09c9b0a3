"""Run every benchmark script in this folder, one after another, each in its own process.

`python benchmarks/run_all.py` runs the full sizes (long: see BENCHMARKS.md); `--quick` passes --quick to each.
Each script prints its own side-by-side table; this runner only sequences them and reports failures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

# Order matters only for reading the output: data, model, kernels, trainer, parallel, eval. A script's own
# arguments follow its name (kernel_resources.py --table: every tile-table choice compiled, none may spill).
SCRIPTS = ["prepare.py", "fasta_open.py", "fai_build.py", "window_read.py", "sample_read.py", "cli_startup.py", "start_time.py", "model_step.py", "attention.py", "recompute_selection.py",
           "kernel_resources.py --table --jobs 2", "compile.py", "train.py", "fsdp_memory.py --export", "plan.py", "context_parallel.py", "eval.py"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, about a minute per script")
    ap.add_argument("--only", nargs="*", help="run only these scripts (e.g. attention.py)")
    args = ap.parse_args()
    here = Path(__file__).parent
    failed = []
    entries = {entry.split()[0]: entry for entry in SCRIPTS}
    for name in args.only or list(entries):
        name, *own = entries.get(name, name).split()
        path = here / name
        if not path.exists():
            print(f"== {name}: missing, skipped")
            continue
        cmd = [sys.executable, str(path), *own] + (["--quick"] if args.quick else [])
        print(f"\n== {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
