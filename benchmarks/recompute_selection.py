"""Block checkpointing with the forward's key-block selection reused by the recompute, against selecting again.

One decoder block of the tiny preset's shape (hidden 256, 4 heads of 64, 4 KV heads), sparse attention on the
CPU kernel (block 64, budget 19), block checkpointing, fp32: forward + backward of the loss at 64K and 256K
tokens (`--quick`: 16K), with the trainer's allocator setting for the length (lcft.train.memory). Each side runs
in a fresh process (its own peak RSS): one warm-up step, then the fastest of `--steps` timed steps. "select again" is the same code with the memo bypassed (SelectionMemo.take
calls the selector every time), which is what block checkpointing did before the recompute reused selections.
Prints the selector calls per step, the step time of each side, their ratio and each side's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LENGTHS = [65536, 262144]


def child(length: int, reuse: bool, steps: int) -> dict:
    """Inside the fresh process: the model, one warm-up step and `steps` timed ones."""
    import torch

    from lcft.kernels.selection_memo import SelectionMemo
    from lcft.kernels.selectors import BlockMeanSelector
    from lcft.model import AttentionConfig, Llama, preset
    from lcft.parallel.activations import apply_activation_checkpointing
    from lcft.train.memory import return_freed_buffers_to_os
    from lcft.train.step import LossModel

    return_freed_buffers_to_os(length)  # as `lcft train` does for this length

    if not reuse:
        SelectionMemo.take = lambda self, select: select()  # every run selects, the recompute too
    calls = [0]
    select = BlockMeanSelector.select

    def counted(self, *args):
        calls[0] += 1
        return select(self, *args)

    BlockMeanSelector.select = counted
    cfg = preset("tiny")
    cfg.num_hidden_layers = 1
    cfg.attention = AttentionConfig.from_dict({"backend": "sparse", "block_size": 64, "impl": "cpu"})
    torch.manual_seed(0)
    model = Llama(cfg)
    apply_activation_checkpointing(model, "block")
    lm = LossModel(model, 1e-4, 8192)
    ids = torch.randint(4, 8, (1, length))  # (1, L)

    def step() -> float:
        t0 = time.perf_counter()
        loss, _, _ = lm(ids, ids)
        loss.backward()
        lm.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step()
    calls[0] = 0
    times = [step() for _ in range(steps)]
    return {"seconds": min(times), "selections": calls[0] // steps,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16K only")
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each side per length")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        length, reuse = json.loads(args.case)
        print(json.dumps(child(length, reuse, args.steps)))
        return 0
    import torch

    from lcft.train.precision import cpu_describe

    print(f"CPU: {cpu_describe()}; threads {torch.get_num_threads()}; one tiny-shape block, sparse, block "
          "checkpointing, fp32, forward + backward of the loss")
    print("| tokens | selections per step (reuse / again) | step s, reuse | step s, again | again / reuse | "
          "peak RSS GiB, reuse | peak RSS GiB, again |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for length in [16384] if args.quick else LENGTHS:
        res = {}
        for reuse in (True, False):
            cmd = [sys.executable, __file__, "--case", json.dumps([length, reuse]), "--steps", str(args.steps)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"| {length // 1024}K | failed: {(p.stderr.strip().splitlines() or ['?'])[-1]} |")
                failed = True
                break
            res[reuse] = json.loads(p.stdout.strip().splitlines()[-1])
        else:
            a, b = res[True], res[False]
            print(f"| {length // 1024}K | {a['selections']} / {b['selections']} | {a['seconds']:.2f} | "
                  f"{b['seconds']:.2f} | {b['seconds'] / a['seconds']:.3f}x | {a['peak_rss'] / 2**30:.2f} | "
                  f"{b['peak_rss'] / 2**30:.2f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
