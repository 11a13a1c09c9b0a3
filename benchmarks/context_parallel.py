"""Context parallelism on CPU (gloo): one training step of the tiny-shaped model, cp=1 vs cp=2.

Per case, fresh processes (so peak RSS is the case's own) run one forward + backward of a 256K-token window
(`--quick`: 8K) with sparse attention and per-block activation checkpointing. Printed side by side:
per-rank peak RSS and its ratio to cp=1 (target <= 0.6), step wall time, each rank's compute time (step minus
time inside collectives) and their imbalance (target within 10% with zigzag; contiguous shown too), and bytes
each rank sent per step with --cp-kv all, selected and stream (`--cases` picks some; cp=1 always runs).

    python benchmarks/context_parallel.py [--quick] [--length 256K] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [  # (name, cp, layout, kv)
    ("cp=1", 1, "zigzag", "all"),
    ("cp=2 zigzag all", 2, "zigzag", "all"),
    ("cp=2 zigzag selected", 2, "zigzag", "selected"),
    ("cp=2 contiguous all", 2, "contiguous", "all"),
    ("cp=2 zigzag stream", 2, "zigzag", "stream"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def worker(args: argparse.Namespace) -> dict | None:
    """One rank of one case: build the model, run `steps` steps, return (and write) this rank's figures.

    Under torchrun (`--torchrun`) the rank comes from the environment, and on CUDA the backend is NCCL and
    memory is the device's peak allocation."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import torch.distributed as dist

    from lcft.genomics.dataset import batch_counts
    from lcft.kernels import chunked_cross_entropy
    from lcft.kernels.spec import SparseSpec
    from lcft.model import AttentionConfig, Llama, preset
    from lcft.parallel import ContextParallelRunner, ParallelConfig, apply_context_parallel, init_parallel
    from lcft.parallel.activations import apply_activation_checkpointing
    from lcft.parallel.comms import STATS
    from lcft.parallel.mesh import group_backend
    from lcft.train.global_step import Normaliser, world_sum

    cuda = args.device == "cuda"
    if args.torchrun:
        args.rank, args.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.world > 1:
        dist.init_process_group(group_backend() if cuda else "gloo", rank=args.rank, world_size=args.world)
    cfg = preset("tiny")
    spec = SparseSpec(block_size=args.block, top_k=args.top_k, local_blocks=1, sink_blocks=1)
    cfg.attention = AttentionConfig(backend="sparse", sparse=spec, impl="auto")
    torch.manual_seed(0)
    model = Llama(cfg).to(device)
    apply_activation_checkpointing(model, "block")
    pcfg = ParallelConfig(cp=args.world, cp_layout=args.layout, cp_kv=args.kv)
    state = init_parallel(pcfg)
    apply_context_parallel(model, state, pcfg)
    runner = ContextParallelRunner(state, pcfg, spec.block_size)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 8, (1, args.length), generator=g)  # (1, L) A/C/G/T
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    counts = batch_counts([{"labels": labels}], np.ones(cfg.vocab_size, dtype=np.int64))  # host labels
    ids, labels = ids.to(device), labels.to(device)
    local, _ = runner.shard({"labels": labels, "input_ids": ids})
    base_rss = _peak_rss()  # torch, model and data before the first step
    times, compute, sent = [], [], {}
    STATS.synchronize = cuda  # NCCL returns once a collective is queued: time each to its end
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and args.bf16)
    for _ in range(args.steps):
        model.zero_grad(set_to_none=True)
        STATS.reset()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        # The trainer's normaliser (its all-reduce counted under 'loss'); without DDP the gradient stays unsynchronised.
        norm = Normaliser.of(counts, args.world, args.world, accum=1)
        with autocast:
            hidden, _ = runner.hidden_states(model, ids)  # (1, L/cp, H)
        loss_sum, _ = chunked_cross_entropy(hidden.float(), model.lm_head_weight, local["labels"])
        (loss_sum * norm.scale).backward()
        loss = norm.per_token(world_sum([loss_sum.item()])[0])
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        compute.append(dt - STATS.seconds)
        sent = STATS.snapshot()
    out = {"rank": args.rank, "loss": loss, "step_s": times[-1], "compute_s": compute[-1],
           "peak_rss": _peak_rss(), "base_rss": base_rss, "bytes": sent,
           "peak_device": torch.cuda.max_memory_allocated(device) if cuda else 0}
    if args.out:
        Path(args.out).write_text(json.dumps(out))
    if args.torchrun:
        ranks = [out]
        if args.world > 1:
            ranks = [None] * args.world
            dist.all_gather_object(ranks, out)
        if args.rank == 0:
            _print_case(f"cp={args.world} {args.layout} {args.kv}", ranks, None)
    if args.world > 1:
        dist.destroy_process_group()
    return out


def run_case(cp: int, layout: str, kv: str, args: argparse.Namespace) -> list[dict]:
    """Start the case's ranks as fresh processes; return each rank's figures."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(cp):
            # A fixed mmap threshold makes glibc return freed large tensors to the OS at once, so peak RSS
            # measures live memory rather than allocator fragmentation (the same for every case).
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(args.threads),
                       MALLOC_MMAP_THRESHOLD_="1048576")
            cmd = [sys.executable, __file__, "--worker", "--rank", str(r), "--world", str(cp), "--layout", layout,
                   "--kv", kv, "--out", f"{tmp}/rank{r}.json", "--length", str(args.length), "--steps",
                   str(args.steps), "--threads", str(args.threads), "--block", str(args.block),
                   "--top-k", str(args.top_k)]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"case cp={cp} {layout} {kv} failed: exit codes {codes}")
        return [json.loads(Path(f"{tmp}/rank{r}.json").read_text()) for r in range(cp)]


HEADER = (f"{'case':<22} {'peak RSS/rank GiB':>18} {'vs cp=1':>8} {'step s':>8} {'compute s per rank':>20} "
          f"{'imbalance':>10} {'sent/rank/step MiB':>19} {'loss':>8}")


def _print_case(name: str, ranks: list[dict], base: dict | None) -> None:
    """One row: worst rank's peak memory (device memory on CUDA), step time, per-rank compute, bytes sent."""
    key = "peak_device" if ranks[0].get("peak_device") else "peak_rss"
    mem = max(r[key] for r in ranks)
    ratio = f"{mem / base[key]:>7.2f}x" if base else f"{'':>8}"
    comp = [r["compute_s"] for r in ranks]
    imbalance = (max(comp) - min(comp)) / max(comp) if len(comp) > 1 else 0.0
    sent = max(sum(r["bytes"].values()) for r in ranks)
    per_rank = " / ".join(f"{c:.1f}" for c in comp) if len(comp) <= 4 else f"{min(comp):.1f} .. {max(comp):.1f}"
    print(f"{name:<22} {mem / (1 << 30):>18.2f} {ratio} {max(r['step_s'] for r in ranks):>8.1f} "
          f"{per_rank:>20} {imbalance:>9.1%} {sent / (1 << 20):>19.1f} {ranks[0]['loss']:>8.4f}", flush=True)


def _size(text: str) -> int:
    from lcft.config import parse_size

    return parse_size(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a 32K-token window (about a minute per case on an idle 2-core machine)")
    ap.add_argument("--length", type=_size, default=None, help="window length (default 256K; --quick 8K)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--block", type=int, default=64, help="sparse attention block size")
    ap.add_argument("--top-k", type=int, default=16, help="sparse attention top-k blocks")
    ap.add_argument("--steps", type=int, default=None, help="steps per case; the last is measured")
    ap.add_argument("--torchrun", action="store_true",
                    help="run ONE case as this torchrun rank (cp = world size; see context_parallel_gpu.sh)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="with --torchrun: cuda = NCCL")
    ap.add_argument("--bf16", action="store_true", help="with --device cuda: bf16 autocast")
    ap.add_argument("--layout", default="zigzag", choices=["zigzag", "contiguous"], help="with --torchrun")
    ap.add_argument("--kv", default="all", choices=["all", "selected", "stream"], help="with --torchrun")
    ap.add_argument("--cases", default="", help="comma-separated case names to run (default: all; cp=1 always runs)")
    # worker-only options
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.length is None:
        args.length = (8 << 10) if args.quick else (256 << 10)
    if args.steps is None:
        args.steps = 1
    if args.worker or args.torchrun:
        worker(args)
        return

    mib = 1 << 20
    print(f"context parallelism, CPU gloo: tiny model (hidden 256, 4 layers, 4 heads), sparse attention "
          f"(block {args.block}, top_k {args.top_k}), block checkpointing, window {args.length // 1024}K tokens, "
          f"{args.threads} thread(s) per rank; one fresh set of processes per case", flush=True)
    wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
    unknown = wanted - {c[0] for c in CASES}
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(sorted(unknown))}; cases: {', '.join(c[0] for c in CASES)}")
    cases = [c for c in CASES if not wanted or c[0] in wanted or c[0] == "cp=1"]
    results = {}
    for name, cp, layout, kv in cases:
        t0 = time.perf_counter()
        results[name] = run_case(cp, layout, kv, args)
        print(f"  {name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    base = results["cp=1"][0]
    print("\n" + HEADER + "\n" + "-" * len(HEADER))
    for name, _, _, _ in cases:
        _print_case(name, results[name], base)
    kv = {n: sum(r["bytes"].get("kv", 0) + r["bytes"].get("kv_grad", 0) for r in results[n])
          for n, cp, _, _ in cases if cp > 1}
    if kv:
        ref = kv.get("cp=2 zigzag all")
        print("\nK/V bytes per step (both ranks, forward + backward): " + ", ".join(
            f"{n.removeprefix('cp=2 ')} {b / mib:.1f} MiB" + (f" ({b / ref:.2f}x all)" if ref else "")
            for n, b in kv.items()))
        other = {n: sum(v for r in results[n] for k, v in r["bytes"].items() if k not in ("kv", "kv_grad"))
                 for n in kv}
        print("other bytes (summaries, indices, loss sums): "
              + ", ".join(f"{n.removeprefix('cp=2 ')} {b / mib:.2f} MiB" for n, b in other.items()))
    growth = {n: max(r["peak_rss"] - r["base_rss"] for r in results[n]) for n, _, _, _ in cases}
    print("peak RSS growth during the step (peak - before it, i.e. without torch and the model): "
          + ", ".join(f"{n} {g / (1 << 30):.2f} GiB ({g / growth['cp=1']:.2f}x)" for n, g in growth.items()))
    print("imbalance = (slowest - fastest) / slowest of the ranks' compute time (step minus time in collectives);"
          " RSS target cp=2 <= 0.6x cp=1")


if __name__ == "__main__":
    main()
