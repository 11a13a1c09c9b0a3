"""Eval throughput vs the training forward pass: the tiny preset on one real held-out window, on CPU.

Cases, same weights and the same window (the bundled human sample's chr22 piece):
  train-fwd  the training loss forward with gradients enabled, as the trainer runs it (hidden states +
             chunked cross-entropy), no backward: the baseline.
  eval       lcft.evaluate.token_losses: the per-token losses eval reduces (labels, no_grad, per-token loss).
Timing alternates the cases rep by rep in one process (so load drift from other jobs hits both alike) and
reports wall and CPU time; peak RSS is measured per case in a fresh subprocess. Target: eval time at most
1.2x the training forward's. `--quick`: an 8K window instead of 64K.

Then, in the same process, what the report's extras cost against a plain eval of the same windows (the same
model twice: whole window and cut to 1/8 of it, as a long-context run and its control): the paired bootstrap
(1000 replicates behind every interval; target: under 5% of the plain eval) and the copy probe (per distance
and window, in plain window evaluations: 3 forward passes, control, exact and mutated copy; a checkpoint cut
to --max-context runs only the last piece).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

CASES = ("train-fwd", "eval")


def _data(length: int) -> Path:
    """The bundled sample prepared into windows of this length (train = chr2 piece, held out = chr22 piece)."""
    from lcft.genomics import prepare_windows, sample_fasta

    out = Path(tempfile.gettempdir()) / f"lcft-bench-eval-{length}"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=length, train=("chr2",), eval=("chr22",))
    return out


def _window(length: int) -> torch.Tensor:
    """The first held-out window of the bundled sample at this length, (1, L) int64."""
    from lcft.genomics import open_windows

    ws = open_windows(_data(length), "eval")
    return torch.from_numpy(np.asarray(ws[0]).astype(np.int64))[None]  # (1, L)


def _model(attention: str) -> torch.nn.Module:
    from lcft.model import Llama, preset

    cfg = preset("tiny")
    cfg.attention.backend = attention
    torch.manual_seed(0)
    return Llama(cfg).eval()


def _runner(case: str, model: torch.nn.Module, ids: torch.Tensor):
    from lcft.evaluate.losses import token_losses, window_labels
    from lcft.kernels import chunked_cross_entropy

    if case == "eval":
        return lambda: token_losses(model, ids)
    labels = window_labels(ids)  # (1, L)

    def train_forward() -> torch.Tensor:
        with torch.enable_grad():
            hidden = model.hidden_states(ids)  # (1, L, H), activations kept for a backward
            loss_sum, count = chunked_cross_entropy(hidden, model.lm_head_weight, labels)
            return loss_sum / count.clamp(min=1)

    return train_forward


def _peak_rss_child(case: str, length: int, attention: str) -> float:
    """Run one case once in a fresh interpreter; its peak RSS in GiB."""
    out = subprocess.run([sys.executable, __file__, "--child", case, "--length", str(length),
                          "--attention", attention], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_gib"]


def child(case: str, length: int, attention: str) -> None:
    ids, model = _window(length), _model(attention)
    _runner(case, model, ids)()
    print(json.dumps({"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def costs(length: int, attention: str, windows: int, reps: int) -> None:
    """Bootstrap and copy-probe cost against a plain eval of the same windows, printed as rows."""
    import dataclasses

    from lcft.checkpoint.hf_folder import save_pretrained
    from lcft.evaluate.binning import bin_edges
    from lcft.evaluate.checkpoints import prepare_checkpoints
    from lcft.evaluate.config import EvalConfig
    from lcft.evaluate.inputs import open_split
    from lcft.evaluate.probe import CopyProbe, default_distances, run_probe
    from lcft.evaluate.report import build_report
    from lcft.evaluate.split import run_checkpoint

    model, cut = _model(attention), length // 8
    ck = Path(tempfile.mkdtemp(prefix="lcft-bench-eval-")) / "tiny"
    save_pretrained(model, ck)
    cfg = EvalConfig(data=str(_data(length)), checkpoints=(str(ck), str(ck)), max_context=(0, cut),
                     max_windows=windows, device="cpu", out=str(ck.parent / "report"), bootstrap=1000)
    ws = open_split(cfg)
    infos = prepare_checkpoints(cfg, ws.length, ws.manifest.get("tokenizer", {}))
    n, dev = min(windows, len(ws)), torch.device("cpu")
    results, each = [], []
    for c in (0, cut):
        t0 = time.perf_counter()
        results.append(run_checkpoint(model, ws, n, cfg, c, dev))
        each.append(time.perf_counter() - t0)
    plain = sum(each)
    one = dataclasses.replace(cfg, bootstrap=1)  # the same report with a single replicate
    edges = bin_edges(ws.length, cfg.bins, cfg.bin_scale)
    full = _median_time(lambda: build_report(cfg, ws, n, infos, results, edges), reps)
    base = _median_time(lambda: build_report(one, ws, n, infos, results, edges), reps)
    extra = max(full - base, 0.0)
    print(f"\nreport extras: tiny preset, 2 checkpoints (whole window, cut to {cut:,}), {n} windows of {length:,} "
          f"tokens, {cfg.bins} bins; plain eval {plain:.2f} s")
    ok = extra <= 0.05 * plain
    print(f"bootstrap, 1000 replicates (3 subsets x bins, overall, trend): {extra * 1e3:.1f} ms = "
          f"{100 * extra / plain:.2f}% of the plain eval (target < 5%: {'met' if ok else 'NOT met'})")
    _store_cost(model, ws, n, cfg, each[0], ck.parent / "store")
    distances = default_distances(length, 256)
    for label, c, own in (("whole window", 0, each[0]), (f"cut to {cut:,}", cut, each[1])):
        probe = CopyProbe(ws, 1, 256, distances, 0.1, 0)
        t0 = time.perf_counter()
        run_probe(model, probe, cfg, c, dev)
        per = (time.perf_counter() - t0) / len(distances)
        print(f"copy probe, {label}: {per:.2f} s per distance and window ({len(distances)} distances up to "
              f"{distances[-1]:,}) = {per / (own / n):.1f}x its plain eval of a window")


def _store_cost(model: torch.nn.Module, ws, n: int, cfg, plain: float, folder: Path) -> None:
    """What keeping the whole-window pass's losses for a resume costs (the time inside LossStore.add, in a run
    of that pass), and how long a resumed run takes to read them back instead."""
    from lcft.evaluate.split import run_checkpoint
    from lcft.evaluate.store import LossStore

    store, spent, dev = LossStore(folder, {"bench": 1}, ws.length), [0.0], torch.device("cpu")
    add = store.add

    def timed(*item) -> None:
        t0 = time.perf_counter()
        add(*item)
        spent[0] += time.perf_counter() - t0

    store.add = timed  # type: ignore[method-assign]
    t0 = time.perf_counter()
    run_checkpoint(model, ws, n, cfg, 0, dev, store=store)
    run = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_checkpoint(model, ws, n, cfg, 0, dev, store=LossStore(folder, {"bench": 1}, ws.length))
    back = time.perf_counter() - t0
    size = (folder / ".partial" / f"{store.path.name}").stat().st_size
    print(f"losses kept for a resume ({size / n / ws.length:.3f} bytes a token): {spent[0] * 1e3:.1f} ms of a "
          f"{run:.2f} s pass = {100 * spent[0] / run:.2f}%; a resumed pass reads them back in {back * 1e3:.0f} ms, "
          f"{plain / back:.0f}x faster than computing them ({plain:.2f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8K window instead of 64K")
    ap.add_argument("--length", type=int, default=None, help="window length (default 65536, 8192 with --quick)")
    ap.add_argument("--attention", default="sparse", choices=("sparse", "dense"),
                    help="attention backend of the tiny preset (dense is quadratic: impractical at 64K on CPU)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per case (default 3)")
    ap.add_argument("--cost-windows", type=int, default=4, help="held-out windows of the bootstrap/probe rows")
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    length = args.length or (8192 if args.quick else 65536)
    if args.child:
        child(args.child, length, args.attention)
        return 0
    reps = args.reps or 3
    _window(length)  # prepared once here, so the children only open it
    # Children first: Linux keeps a process's peak RSS across fork+exec, so a child forked from a parent that
    # has already run the cases would report the parent's peak, not its own.
    rss = {c: _peak_rss_child(c, length, args.attention) for c in CASES}
    ids, model = _window(length), _model(args.attention)
    runs = {c: _runner(c, model, ids) for c in CASES}
    for fn in runs.values():  # warm-up: allocator, thread pools, lazy imports
        fn()
    wall: dict[str, list[float]] = {c: [] for c in CASES}
    cpu: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(reps):
        for c, fn in runs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[c].append(time.perf_counter() - w0)
            cpu[c].append(time.process_time() - c0)

    print(f"eval benchmark: tiny preset, {args.attention} attention, one {length:,}-token held-out window, fp32, "
          f"CPU ({torch.get_num_threads()} threads), median of {reps} alternating reps")
    print(f"{'case':<34}{'tokens/s':>10}{'wall s':>9}{'CPU s':>9}{'peak RSS GiB':>14}")
    names = {"train-fwd": "training forward (grad enabled)", "eval": "eval (lcft.evaluate.token_losses)"}
    for c in CASES:
        w, p = statistics.median(wall[c]), statistics.median(cpu[c])
        print(f"{names[c]:<34}{length / w:>10,.0f}{w:>9.2f}{p:>9.2f}{rss[c]:>14.2f}")
    ratio_wall = statistics.median(wall["eval"]) / statistics.median(wall["train-fwd"])
    ratio_cpu = statistics.median(cpu["eval"]) / statistics.median(cpu["train-fwd"])
    ok = ratio_wall <= 1.2
    print(f"eval time / training-forward time: {ratio_wall:.2f} wall, {ratio_cpu:.2f} CPU "
          f"(target <= 1.2: {'met' if ok else 'NOT met'}); peak RSS eval / training forward: "
          f"{rss['eval'] / rss['train-fwd']:.2f}")
    costs(length, args.attention, args.cost_windows, reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
