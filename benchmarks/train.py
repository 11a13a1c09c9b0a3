"""Trainer benchmark: (A) the trainer's tokens/s against the bare model step (forward, backward, AdamW on the
same model and batch) in the same process: the trainer's overhead; (B) one training step of the tiny preset on
long windows with sparse attention and block checkpointing, each case in a fresh process: time, peak RSS and the
top operators.

    python benchmarks/train.py            # A at 16K tokens, B at 128K and at 1M tokens
    python benchmarks/train.py --quick    # A at 4K tokens, B at 8K (no 1M)
    python benchmarks/train.py --long 32K,128K   # choose the (B) lengths
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lcft.config import format_size, parse_size
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.genomics.dataset import DataConfig, TrainSamples
from lcft.kernels import chunked_cross_entropy
from lcft.model import Llama, preset
from lcft.train import TrainConfig, TrainHooks, train
from lcft.train.metrics import read_metrics
from lcft.train.step import make_optimizer

GIB = 1 << 30


def prepared(root: Path, length: int) -> Path:
    """Windows of `length` tokens from the bundled human sample (chr2: 2.3 Mbp)."""
    out = root / f"windows-{format_size(length)}"
    held_out = ("chr22",) if length <= 1_000_000 else ()  # the chr22 piece is 1,000,000 bp: no 1M window
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=length, train=("chr2",), eval=held_out)
    return out


class BareStep:
    """Forward + chunked loss + backward + clip + AdamW of a separate tiny model on the trainer's first batch
    (the same step as benchmarks/model_step.py's lcft side), timed."""

    def __init__(self, cfg: TrainConfig, data: Path, seq: int) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.model = cfg, Llama(preset("tiny"))
        self.opt = make_optimizer(self.model, cfg)
        samples = TrainSamples(open_windows(data, "train"), DataConfig(seq, cfg.seed))
        self.batch = samples.batch([samples.sample_id(0)])
        self.times: list[float] = []

    def __call__(self, step: int) -> None:
        t0 = time.perf_counter()
        h = self.model.hidden_states(self.batch["input_ids"])  # (1, L, H)
        loss, count = chunked_cross_entropy(h, self.model.lm_head_weight, self.batch["labels"],
                                            z_loss=self.cfg.z_loss)
        (loss / count).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.times.append(time.perf_counter() - t0)


def overhead(root: Path, seq: int, steps: int) -> None:
    """Bare step and trainer step alternate (the bare one runs from the trainer's before_step hook), so both
    see the same load on a shared machine; trainer time = elapsed per step minus the bare step inside it."""
    data = prepared(root, seq)
    cfg = TrainConfig(data=str(data), out=str(root / f"run-{seq}"), preset="tiny", seq_len=seq, steps=steps + 1,
                      global_batch=1, precision="fp32", save_every=0, progress=False)
    bare = BareStep(cfg, data, seq)
    train(cfg, TrainHooks(before_step=bare))
    el = [0.0] + [r["elapsed"] for r in read_metrics(cfg.out)]
    ours = [b - a - t for a, b, t in zip(el[:-1], el[1:], bare.times, strict=True)]
    pairs = list(zip(bare.times, ours, strict=True))[1:]  # the first pair warms up allocator and kernels
    tb, tt = statistics.median(b for b, _ in pairs), statistics.median(t for _, t in pairs)
    ratio = statistics.median(t / b for b, t in pairs)
    print(f"\n(A) tiny preset, {format_size(seq)} tokens, fp32, dense attention, {torch.get_num_threads()} threads")
    print(f"{'':24}{'s/step (median)':>16}{'tokens/s':>12}   steps")
    print(f"{'bare model step':24}{tb:16.3f}{seq / tb:12.0f}   {len(pairs)}")
    print(f"{'lcft trainer':24}{tt:16.3f}{seq / tt:12.0f}   {len(pairs)}")
    print(f"trainer overhead: {100 * (ratio - 1):+.1f}% (median of per-step ratios; target < 5%); pairs (bare, "
          f"trainer) s: {[(round(b, 2), round(t, 2)) for b, t in pairs]}")


def one_step_child(data: str, out: str, seq: int, profile: bool, precision: str = "fp32") -> None:
    """In a fresh process: one sparse, block-checkpointed training step; prints a JSON line."""
    cfg = TrainConfig(data=data, out=out, preset="tiny", seq_len=seq, steps=1, global_batch=1, precision=precision,
                      attention="sparse", checkpointing="block", save_every=0, progress=False)
    top: list[tuple[str, float]] = []
    t0 = time.perf_counter()
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof

        with prof(activities=[ProfilerActivity.CPU]) as p:
            train(cfg)
        ev = sorted(p.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in ev) or 1
        top = [(e.key, round(100 * e.self_cpu_time_total / total, 1)) for e in ev[:6]]
    else:
        train(cfg)
    wall = time.perf_counter() - t0
    rec = read_metrics(out)[0]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seq": seq, "step_s": round(seq / rec["tokens_per_s"], 1), "wall_s": round(wall, 1),
                      "peak_rss": rss, "loss": rec["loss"], "top": top}))


def long_step(root: Path, seq: int, profile: bool, limit_gib: float, precision: str = "fp32") -> None:
    data = prepared(root, seq)
    cmd = [sys.executable, __file__, "--child", str(data), str(root / f"long-{seq}"), str(seq),
           "--precision", precision] + (["--profile"] if profile else [])

    def cap() -> None:  # the host is shared: fail with an allocation error instead of waking the OOM killer
        lim = int(limit_gib * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cap)
    wall = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines()[::-1] if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"{format_size(seq):>6}  FAILED after {wall:.0f} s (address-space cap {limit_gib:.0f} GiB): {err}")
        return
    r = json.loads(line)
    print(f"{format_size(seq):>6}{r['step_s']:>10.1f}{r['wall_s']:>10.1f}{r['peak_rss'] / GIB:>12.2f}"
          f"{r['peak_rss'] / seq / 1024:>12.1f}   loss {r['loss']:.3f}")
    for name, pct in r["top"]:
        print(f"        {pct:5.1f}%  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="A at 4K tokens, B at 8K only (about a minute)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per side in (A); 0 skips (A)")
    ap.add_argument("--cap-gib", type=float, default=20.0, help="address-space cap of each (B) process")
    ap.add_argument("--long", default=None, help="comma-separated lengths for (B), or none (default 128K,1M; quick 8K)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="precision of the (B) steps")
    args = ap.parse_args()
    if args.child:
        one_step_child(args.child[0], args.child[1], int(args.child[2]), args.profile, args.precision)
        return
    with tempfile.TemporaryDirectory(prefix="lcft-bench-train-") as tmp:
        root = Path(tmp)
        if args.steps > 0:
            overhead(root, 4096 if args.quick else 16384, args.steps)
        print("\n(B) one training step, tiny preset, sparse attention (block 64, top-k 16), block checkpointing, "
              f"{args.precision}, fresh process each, {os.environ.get('OMP_NUM_THREADS', torch.get_num_threads())} threads")
        print(f"{'tokens':>6}{'step s':>10}{'wall s':>10}{'peak GiB':>12}{'KiB/token':>12}")
        spec = args.long or ("8K" if args.quick else "128K,1M")
        lengths = [] if spec == "none" else [parse_size(x) for x in spec.split(",")]
        for seq in lengths:
            long_step(root, seq, profile=seq <= 131072, limit_gib=args.cap_gib, precision=args.precision)


if __name__ == "__main__":
    main()
