"""Training samples as the trainer reads them: narrow batches (`TrainSamples.batch`: the windows' uint8 ids, int16
labels, widened by the model and the loss) against the int64 batches made on the host before, in one process.

The windows of benchmarks/window_read.py (a generated soft-masked genome, 512K tokens a window, char tokenizer,
kept between runs, in the page cache after a warm-up pass); --reads random samples (seeded) a pass, each one
micro-batch of one sample, for whole windows (--seq-len 512K) and one aligned 64K piece of each. Two times per
case: the sample read alone (`batch`, what the host does before every forward) and the read plus the widening to
int64 that the forward then does (`Llama.hidden_states` for the ids, `chunked_cross_entropy` for the labels): on
CPU both are host work; on a GPU the widening runs on the device, after a transfer of 3 bytes a token, not 16.
The int64 side is the code as it was (`int64_batch`). Cases alternate pass by pass, each first in every other
pair; the median of --repeat passes, per sample. Peak RSS of each case in a fresh process that holds one step's
--accum micro-batches at once, as `GlobalStep._step` does, and widens them one at a time (VmHWM; torch imported).
Both run under the trainer's allocator setting for 512K windows, numpy's huge-page advice off (see window_read).

Then eval's batches the same way: --eval-batch whole windows (`ws[i]`, as `run_checkpoint` reads them) stacked
by `host_batch` (the windows' uint8 ids) against the int64 stack eval made before (`eval_int64_batch`), alone
and with `token_losses`' widening (`.long()`; on a GPU it runs on the device); peak RSS of a fresh process that
stacks each batch in turn, without the widening: what the host holds of a batch on a GPU run.

    python benchmarks/sample_read.py            # 256 windows, 200 samples a pass
    python benchmarks/sample_read.py --quick    # 64 windows, 50 samples
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from window_read import PIECE, L, child_peak_rss, cpu_capability, prepared  # noqa: E402 (the same windows)

from lcft.evaluate.losses import host_batch  # noqa: E402
from lcft.genomics import open_windows  # noqa: E402
from lcft.genomics.dataset import IGNORE_INDEX, DataConfig, TrainSamples  # noqa: E402
from lcft.train.memory import return_freed_buffers_to_os  # noqa: E402

CASES = ("int64", "narrow")
EVAL_CASES = ("eval-int64", "eval-narrow")


def int64_batch(samples: TrainSamples, sample_ids: list[int]) -> dict[str, torch.Tensor]:
    """The batch as `TrainSamples.batch` made it before (no rc flips, no soft-mask weights): int64 on the host."""
    examples = []
    for s in sample_ids:
        window, off = samples.locate(s)
        n = samples.cfg.seq_len
        ids = samples.windows.ids(window, off, off + n).astype(np.int64)  # (n,)
        labels = np.full(n, IGNORE_INDEX, dtype=np.int64)  # (n,)
        nxt = ids[1:]
        labels[: nxt.size] = np.where(samples.counted[nxt], nxt, IGNORE_INDEX)
        examples.append({"input_ids": ids, "labels": labels})
    return {k: torch.from_numpy(np.stack([e[k] for e in examples])) for k in examples[0]}


def read(samples: TrainSamples, case: str, sample_ids: list[int]) -> dict[str, torch.Tensor]:
    return int64_batch(samples, sample_ids) if case == "int64" else samples.batch(sample_ids)


def eval_int64_batch(windows: list[np.ndarray]) -> torch.Tensor:
    """The batch as `window_losses` stacked it before: int64 on the host."""
    return torch.from_numpy(np.stack(windows).astype(np.int64))


def eval_pass(ws: Any, case: str, groups: list[list[int]], with_widen: bool) -> float:
    """Wall seconds to stack `groups`' eval batches (and widen each, when asked)."""
    stack = eval_int64_batch if case == "eval-int64" else host_batch
    t = time.perf_counter()
    for g in groups:
        ids = stack([np.asarray(ws[i]) for i in g])  # (B, L)
        if with_widen:
            ids.long()
    return time.perf_counter() - t


def widen(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the forward does with a batch's integers before using them: `Llama.hidden_states` takes int32/int64
    ids as they are and widens others; `chunked_cross_entropy` widens the labels (a no-op on int64)."""
    ids = batch["input_ids"]
    ids = ids if ids.dtype in (torch.int32, torch.int64) else ids.long()
    return ids, batch["labels"].reshape(-1).long()


def one_pass(samples: TrainSamples, case: str, order: list[int], with_widen: bool) -> float:
    """Wall seconds to read `order`'s samples one micro-batch each (and widen them, when asked)."""
    t = time.perf_counter()
    for s in order:
        batch = read(samples, case, [s])
        if with_widen:
            widen(batch)
    return time.perf_counter() - t


def child(samples: TrainSamples, case: str, order: list[int], accum: int) -> None:
    """Steps of `accum` micro-batches held at once, each widened in turn; prints the peak RSS (KiB) as JSON."""
    for a in range(0, len(order) - accum + 1, accum):
        batches = [read(samples, case, [s]) for s in order[a : a + accum]]
        for b in batches:
            widen(b)
    hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")]
    print(json.dumps({"rss_kib": hwm[0]}))


def eval_child(ws: Any, case: str, groups: list[list[int]]) -> None:
    """Every eval batch stacked in turn (none widened); prints the peak RSS (KiB) as JSON."""
    eval_pass(ws, case, groups, False)
    hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")]
    print(json.dumps({"rss_kib": hwm[0]}))


def eval_table(ws: Any, windows: list[int], args: argparse.Namespace) -> None:
    """Old and new eval batches of --eval-batch whole windows: ms per batch, ratio, peak RSS."""
    b = args.eval_batch
    groups = [windows[a : a + b] for a in range(0, len(windows) - b + 1, b)]
    rss = "{:.0f} / {:.0f} MiB".format(*(peak_rss(c, args, L) for c in EVAL_CASES))
    print(f"eval batches of {b} whole windows: ms per batch; peak RSS stacking them (no widening)")
    for with_widen in (False, True):
        times: dict[str, list[float]] = {c: [] for c in EVAL_CASES}
        for k in range(args.repeat):
            for case in sorted(times, reverse=k % 2 == 1):
                times[case].append(eval_pass(ws, case, groups, with_widen))
        old, new = (statistics.median(times[c]) / len(groups) * 1e3 for c in EVAL_CASES)
        name = f"{f'eval {b} x 512K':16}{'+ widen' if with_widen else 'read':8}"
        print(f"{name}{old:10.3f}{new:11.3f}{new / old:14.2f}{rss if not with_widen else '':>26}")


def peak_rss(case: str, args: argparse.Namespace, seq: int) -> float:
    return child_peak_rss(__file__, "--child", case, "--windows", args.windows, "--reads", args.reads, "--seq", seq,
                          "--accum", args.accum, "--threads", args.threads, "--eval-batch", args.eval_batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 windows and 50 samples")
    ap.add_argument("--windows", type=int, default=None, help="windows of 512K tokens in the split (default 256)")
    ap.add_argument("--reads", type=int, default=None, help="samples read per pass (default 200)")
    ap.add_argument("--repeat", type=int, default=9, help="passes of each case (alternating); the median is kept")
    ap.add_argument("--accum", type=int, default=8, help="micro-batches a step holds at once (peak RSS)")
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (default: torch's own)")
    ap.add_argument("--eval-batch", type=int, default=2, help="whole windows per eval batch (eval's --batch-size)")
    ap.add_argument("--child", choices=CASES + EVAL_CASES, help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, default=L, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.windows = args.windows or (64 if args.quick else 256)
    args.reads = args.reads or (50 if args.quick else 200)
    folder = prepared(args.windows)
    if args.threads:  # on a loaded machine a second thread of torch's widening waits for a core (ms, not us)
        torch.set_num_threads(args.threads)
    return_freed_buffers_to_os(L)  # as the trainer at this window length
    np._core.multiarray._set_madvise_hugepage(False)  # (numpy's switch for it; see window_read's docstring)
    ws = open_windows(folder, "train")
    windows = [int(i) for i in np.random.default_rng(1).integers(0, args.windows, args.reads)]
    if args.child in EVAL_CASES:
        b = args.eval_batch
        eval_child(ws, args.child, [windows[a : a + b] for a in range(0, len(windows) - b + 1, b)])
        return 0
    if args.child:
        samples = TrainSamples(ws, DataConfig(args.seq))
        child(samples, args.child, [w * samples.pieces + (args.seq < L) for w in windows], args.accum)
        return 0
    print(f"{args.windows} windows of 512K tokens, {args.reads} samples a pass, median of {args.repeat}, cached; "
          f"{torch.get_num_threads()} torch threads; CPU capability {cpu_capability()}; ms per sample; peak RSS holding {args.accum} micro-batches")
    print(f"{'':16}{'':8}{'int64 ms':>10}{'narrow ms':>11}{'narrow/int64':>14}{'  peak RSS int64 / narrow':>26}")
    for seq in (L, PIECE):
        samples = TrainSamples(ws, DataConfig(seq))
        order = [w * samples.pieces + (seq < L) for w in windows]  # the piece at 64K into each window
        one_pass(samples, "narrow", list(range(args.windows)), False)  # warm-up: every window in the page cache
        rss = "{:.0f} / {:.0f} MiB".format(*(peak_rss(c, args, seq) for c in CASES))
        for with_widen in (False, True):
            times: dict[str, list[float]] = {c: [] for c in CASES}
            for k in range(args.repeat):
                for case in sorted(times, reverse=k % 2 == 1):  # each side first in every other pair
                    times[case].append(one_pass(samples, case, order, with_widen))
            old, new = (statistics.median(times[c]) / args.reads * 1e3 for c in CASES)
            name = f"{'512K' if seq == L else '64K of 512K':16}{'+ widen' if with_widen else 'read':8}"
            print(f"{name}{old:10.3f}{new:11.3f}{new / old:14.2f}{rss if not with_widen else '':>26}")
    eval_table(ws, windows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
