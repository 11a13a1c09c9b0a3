"""Starting the command line: `lcft --help` and user errors (a mistyped --cp-kv; found by the job's checks before
torch: `lcft eval` naming a missing data folder, `lcft train` with --cp not dividing the processes) as they run now,
the packages' names resolved lazily (torch imported by the commands that run), against the same commands after
importing what the package __init__ files imported eagerly before (the trainer, the evaluator, the parallel layer:
torch, torch.distributed's FSDP, accelerate).

Each side runs in its own process, alternating, `--repeat` times; prints the fastest wall and CPU time of each,
their ratio, and each side's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

import torch

RUN = """
import json, os, resource, sys, time
t = time.perf_counter()
if sys.argv[1] == "eager":  # what `import lcft.cli.app` imported when the package __init__ files were eager
    import lcft.evaluate.runner, lcft.parallel.parallelize, lcft.train.trainer  # noqa: F401
from lcft.cli.app import app
try:
    app(sys.argv[2:])
except SystemExit as e:
    code = e.code
wall = time.perf_counter() - t
use = resource.getrusage(resource.RUSAGE_SELF)
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")]
print(json.dumps({"wall": wall, "cpu": use.ru_utime + use.ru_stime, "rss_kib": hwm[0], "code": code}),
      file=sys.__stderr__)
"""
MISSING = "/nonexistent/lcft-benchmark"  # a folder no machine has: the commands below stop at it, writing nothing
COMMANDS = {
    "lcft --help": ["--help"],
    "lcft train --cp-kv bogus": ["train", "--cp-kv", "bogus"],
    "lcft eval --data MISSING -c MISSING": ["eval", "--data", MISSING, "-c", MISSING, "--out", MISSING],
    "lcft train --nproc 4 --cp 3": ["train", "--data", MISSING, "--out", MISSING, "--nproc", "4", "--cp", "3"],
}


def once(side: str, argv: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-c", RUN, side, *argv], capture_output=True, text=True,
                       env=os.environ | {"COLUMNS": "100"})
    return json.loads(r.stderr.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    args = ap.parse_args()
    repeat = 3 if args.quick else args.repeat
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.machine())
    print(f"{cpu}, {os.cpu_count()} CPUs, "
          f"{torch.backends.cpu.get_cpu_capability()}; best of {repeat} alternating runs")
    print("| command | lazy: wall s / CPU s / peak RSS MiB | eager imports: wall s / CPU s / peak RSS MiB | "
          "ratio (wall) |")
    print("|---|---|---|---|")
    for name, argv in COMMANDS.items():
        got: dict[str, list[dict]] = {"lazy": [], "eager": []}
        for _ in range(repeat):
            for side in got:
                got[side].append(once(side, argv))
        assert len({r["code"] for runs in got.values() for r in runs}) == 1, got  # the same outcome both ways
        best = {side: {k: min(r[k] for r in runs) for k in ("wall", "cpu", "rss_kib")} for side, runs in got.items()}
        cells = [f"{b['wall']:.2f} / {b['cpu']:.2f} / {b['rss_kib'] / 1024:.0f}" for b in best.values()]
        print(f"| `{name}` | {cells[0]} | {cells[1]} | **{best['eager']['wall'] / best['lazy']['wall']:.1f}x** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
