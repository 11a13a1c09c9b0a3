"""`--compile` against eager: forward + backward of the loss on CPU, tiny and small presets at 4K and 16K tokens.

Each case runs in a fresh process (no compiled graph carried over): eager steps and compiled steps alternate
after the warm-up, so both see the same load on a shared machine; tokens/s from the fastest step of each. The
compile time is the first compiled step minus a compiled step. 16K runs with block checkpointing (as training
at that length would), 4K without. fp32 (or bf16 where the CPU has native bf16: lcft.train.precision).
`--quick` = tiny at 4K only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = [("tiny", 4096), ("tiny", 16384), ("small", 4096), ("small", 16384)]


def child(name: str, length: int, steps: int) -> dict:
    """Inside the fresh process: one eager and one compiled model with the same weights, alternated."""
    import torch

    from lcft.model import Llama, preset
    from lcft.parallel.activations import apply_activation_checkpointing
    from lcft.parallel.compile import compile_blocks
    from lcft.train.precision import bench_dtype
    from lcft.train.step import LossModel

    torch.manual_seed(0)
    models = [Llama(preset(name)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for m in models:
        apply_activation_checkpointing(m, "block" if length > 4096 else "none")
    compile_blocks(models[1], torch.device("cpu"))
    lms = [LossModel(m, 1e-4, 8192) for m in models]
    ids = torch.randint(4, 8, (1, length))  # (1, L)
    bf16 = bench_dtype() == "bf16"

    def step(lm: LossModel) -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _, _ = lm(ids, ids)
        loss.backward()
        lm.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step(lms[0])  # eager warm-up
    first = step(lms[1])  # compiles
    eager, compiled = [], []
    for _ in range(steps):
        eager.append(step(lms[0]))
        compiled.append(step(lms[1]))
    return {"eager_s": min(eager), "compiled_s": min(compiled), "compile_s": first - min(compiled),
            "dtype": "bf16" if bf16 else "fp32"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny at 4K only")
    ap.add_argument("--steps", type=int, default=2, help="timed steps of each side per case")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        name, length = json.loads(args.case)
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(child(name, length, args.steps)))
        return 0
    from lcft.train.precision import cpu_describe

    print(f"CPU: {cpu_describe()}; threads {args.threads or 'torch default'}; forward + backward of the loss")
    print("| preset | tokens | dtype | eager tok/s | compiled tok/s | ratio | compile s |")
    print("|---|---|---|---|---|---|---|")
    env = dict(os.environ)
    for name, length in CASES[:1] if args.quick else CASES:
        cmd = [sys.executable, __file__, "--case", json.dumps([name, length]), "--steps", str(args.steps),
               "--threads", str(args.threads)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(f"| {name} | {length // 1024}K | failed: {(p.stderr.strip().splitlines() or ['?'])[-1]} |")
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"| {name} | {length // 1024}K | {r['dtype']} | {length / r['eager_s']:,.0f} | "
              f"{length / r['compiled_s']:,.0f} | {r['eager_s'] / r['compiled_s']:.2f}x | {r['compile_s']:.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
