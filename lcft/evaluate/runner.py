"""`evaluate(cfg)`: per-token held-out loss through each checkpoint, reduced by position, written as a report."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcft.checkpoint.weights import check_weights_readable, weights_sha256
from lcft.errors import LcftError
from lcft.evaluate.binning import PositionSums, WindowBins, at_base_offsets, bin_edges, to_base_positions
from lcft.evaluate.checkpoints import CheckpointInfo, default_labels
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.parallel import EvalParallel
from lcft.evaluate.probe import CopyProbe, check_probe, default_distances
from lcft.evaluate.recurrence import distance_classes, histogram, nearest_copy, token_distances, window_codes
from lcft.files import folder_lock
from lcft.genomics.tokenizer import A, T
from lcft.kernels.triton_tiles import check_model_kernels_fit
from lcft.liveness import launched
from lcft.parallel.config import ParallelConfig
from lcft.shapes import check_world

IGNORE = -100


def window_labels(ids: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token labels `(B, L)` int64 for windows `ids` `(B, L)`: label[t] = ids[t+1] when it is a base
    A/C/G/T, else -100 (N and <unk> are never a label); the last position predicts nothing. `counted`
    `(vocab,)` bool: the ids that carry loss (a model tokenizer's tokens made only of A/C/G/T)."""
    nxt = ids[:, 1:]  # (B, L-1)
    valid = counted[nxt] if counted is not None else (nxt >= A) & (nxt <= T)
    labels = torch.full_like(ids, IGNORE)  # (B, L)
    labels[:, :-1] = torch.where(valid, nxt, torch.full_like(nxt, IGNORE))
    return labels


def _pieces(length: int, max_context: int) -> list[tuple[int, int]]:
    """[start, end) of the independent pieces a window is cut into (one piece when there is no limit)."""
    c = max_context or length
    return [(s, min(s + c, length)) for s in range(0, length, c)]


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def token_losses(model: torch.nn.Module, ids: torch.Tensor, *, max_context: int = 0,
                 precision: str = "fp32", parallel: EvalParallel | None = None,
                 counted_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss of whole windows `ids` `(B, L)`, aligned to the predicted token's position.

    Returns `loss (B, L)` fp32 and `counted (B, L)` bool: entry p is the loss of predicting token p from the
    tokens before it (p = 0 and N/<unk> targets are not counted, their loss is 0). With `max_context` C > 0
    each window is cut into independent pieces of C tokens, each run with positions 0..C-1, so token p sees
    only the tokens of its own piece (the last token of a piece still predicts the first of the next one
    from its own piece's context, so every window gets the same counted positions with or without a limit).
    """
    from lcft.kernels import per_token_loss

    b, length = ids.shape
    labels = window_labels(ids, counted_ids)  # (B, L)
    per_label = torch.zeros(b, length, dtype=torch.float32, device=ids.device)  # (B, L), index t predicts t+1
    device = ids.device
    pieces = _pieces(length, max_context)
    # Pieces of one length run as one batch: (B * n_pieces, C); the shorter tail piece, if any, on its own.
    groups: dict[int, list[int]] = {}
    for s, e in pieces:
        groups.setdefault(e - s, []).append(s)
    # no_grad, not inference_mode: the CPU sparse kernel spreads heads over worker threads, where inference
    # mode (thread-local) is off, and torch refuses their in-place writes into inference tensors.
    with torch.no_grad(), _autocast(device, precision):
        for size, starts in groups.items():
            x = torch.cat([ids[:, s:s + size] for s in starts])  # (B * n, C), piece-major
            y = torch.cat([labels[:, s:s + size] for s in starts])  # (B * n, C)
            pos = torch.arange(size, device=device)  # (C,) every piece starts at position 0
            if parallel is not None:  # context parallel: each cp rank runs its shard, losses gathered back
                loss = parallel.piece_losses(model, x, y)  # (B * n, C), positions 0..C-1 as below
            else:
                hidden = model.hidden_states(x, position_ids=pos)  # (B * n, C, H)
                loss = per_token_loss(hidden, model.lm_head_weight, y).float()  # (B * n, C)
            for k, s in enumerate(starts):
                per_label[:, s:s + size] = loss[k * b:(k + 1) * b]
    loss = torch.zeros_like(per_label)  # (B, L) aligned to the predicted position
    loss[:, 1:] = per_label[:, :-1]
    counted = torch.zeros_like(labels, dtype=torch.bool)  # (B, L)
    counted[:, 1:] = labels[:, :-1] != IGNORE
    return loss, counted


@dataclass
class CheckpointResult:
    """Accumulated figures of one checkpoint over the split."""

    sums: PositionSums
    windows: list[dict[str, Any]]
    bins: WindowBins
    """Per-window loss sums by position bin, all tokens and split by the soft mask (what the bootstrap draws)."""
    probe: CopyProbe | None = None
    """The copy probe's target losses (with --probe copy)."""
    recurrence: tuple[np.ndarray, np.ndarray] | None = None
    """Distance class edges (classes + 1,) in bases and the counted recurring tokens of each class (classes,):
    the histogram of how far back the k-mer ending at each token occurred earlier in its window."""


def _device(name: str) -> torch.device:
    """--device as a torch device; under a launch each rank's own GPU (cuda:LOCAL_RANK), made current, since
    Triton and NCCL work on the current device."""
    try:
        dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    except RuntimeError:
        raise LcftError(f"unknown device {name!r} (auto, cpu, cuda, cuda:N)") from None
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise LcftError(f"device {name} asked for, but CUDA is not available")
    if launched():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if dev.index is not None and dev.index != local:
            raise LcftError(f"--device {name} under a launch: each rank evaluates on its own GPU (cuda:LOCAL_RANK); "
                            "give --device cuda or auto")
        dev = torch.device("cuda", local)
    if (dev.index or 0) >= torch.cuda.device_count():
        raise LcftError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    torch.cuda.set_device(dev)
    return dev


def load_model(info: CheckpointInfo, device: torch.device) -> torch.nn.Module:
    """The checkpoint's model in eval mode on `device`, in fp32 whatever the file stores (a bf16 export or a
    published bf16 model), as training holds it: --precision says how it computes. Any read failure is a user
    error naming the folder."""
    from lcft.checkpoint.reader import load  # safetensors or a sharded (DCP) checkpoint

    try:
        model = load(info.path, dtype=torch.float32).model
    except LcftError:
        raise
    except Exception as e:  # safetensors, json, shape and key errors all mean "this folder is not usable"
        raise LcftError(f"unreadable checkpoint {info.path}: {type(e).__name__}: {e}") from None
    return model.to(device).eval()


def _batches(n: int, size: int) -> Iterator[list[int]]:
    for s in range(0, n, size):
        yield list(range(s, min(s + size, n)))


def _default_block_size() -> int:
    from lcft.model.config import AttentionConfig

    return int(AttentionConfig().sparse.block_size)


def prepare_checkpoints(cfg: EvalConfig, window: int, tokenizer: dict[str, Any]) -> list[CheckpointInfo]:
    """Resolve and check every checkpoint before any work, so bad input fails fast and writes nothing."""
    n = len(cfg.checkpoints)
    contexts = [cfg.context_of(i) for i in range(n)]
    labels = list(cfg.labels) or default_labels(list(cfg.checkpoints), contexts)
    block = _default_block_size()
    infos: list[CheckpointInfo] = []
    hashes: dict[Path, str] = {}
    for given, label, ctx in zip(cfg.checkpoints, labels, contexts, strict=True):
        info = CheckpointInfo.read(given, label, ctx)
        info.check_tokenizer(tokenizer)
        info.check_max_context(window, info.block_size(block))
        declared = info.config.get("max_position_embeddings")
        if isinstance(declared, int) and (info.max_context or window) > declared:
            print(f"warning: {info.label}: {info.max_context or window}-token contexts are longer than the model's "
                  f"max_position_embeddings {declared}", file=sys.stderr)
        if info.path not in hashes:
            hashes[info.path] = weights_sha256(info.path)
            check_weights_readable(info.path)
        info.sha256 = hashes[info.path]
        infos.append(info)
    return infos


def open_split(cfg: EvalConfig):
    """The split's WindowSet, limited to --max-windows, its files checked against the manifest first (unless
    --no-verify-data); an empty split is an error."""
    from lcft.genomics import open_windows, verify_windows

    data = Path(cfg.data)
    if not data.is_dir():
        raise LcftError(f"data folder not found: {data}")
    if cfg.verify_data:
        verify_windows(data, (cfg.split,))  # names the corrupt file; a flipped byte is not evaluated silently
    ws = open_windows(data, cfg.split)
    if len(ws) == 0:
        raise LcftError(f"split {cfg.split!r} of {data} has no windows: nothing to evaluate")
    return ws


def position_length(ws: Any, position: str) -> int:
    """Positions the bins span: the window length in tokens, or in bases the split's longest window."""
    if position == "bases" and getattr(ws, "records", None):
        return max(int(r["end"]) - int(r["start"]) for r in ws.records)
    return int(ws.length)


def recurrence_distances(ws: Any, i: int) -> np.ndarray:
    """(L,) int64 per token of window i: bases back to the nearest earlier occurrence of the k-mer ending at
    the token's last base (0 = it does not recur in the window)."""
    per_base = ws.token_bases(i) if getattr(ws, "per_base", False) else None  # (L,) or None: one base each
    return token_distances(nearest_copy(window_codes(ws, i)), per_base)


def _at_positions(ws: Any, i: int, loss: np.ndarray, counted: np.ndarray, position: str, length: int
                  ) -> tuple[np.ndarray, ...]:
    """Window i's loss, counted bits, soft mask, bases and recurrence distance per token `(L,)`, by token
    position, or moved to base positions `(length,)` with --position bases."""
    bases = ws.token_bases(i) if hasattr(ws, "token_bases") else None  # (L,)
    # The soft-mask bit of each position is that of the base predicted there.
    soft = ws.softmask(i)  # (L,)
    recur = recurrence_distances(ws, i)  # (L,)
    if position != "bases":
        return loss, counted, soft, bases, recur
    offsets = ws.base_offsets(i)  # (L,)
    return (*to_base_positions(length, offsets, loss, counted, soft, bases),
            at_base_offsets(length, offsets, np.asarray(counted, dtype=bool), recur))


def _window_record(ws: Any, i: int, counted_i: np.ndarray, w_loss: np.ndarray, w_count: np.ndarray
                   ) -> dict[str, Any]:
    """One window's figures in the report from its (subsets, bins) loss sums and counts."""
    n, n_rep, n_rec = int(w_count[0].sum()), int(w_count[1].sum()), int(w_count[3].sum())
    total, rep, rec = float(w_loss[0].sum()), float(w_loss[1].sum()), float(w_loss[3].sum())
    chrom, start, end = ws.coords(i)
    return {"index": i, "chrom": chrom, "start": int(start), "end": int(end),
            "tokens": n, "loss": total / n if n else math.nan, "repeat_tokens": n_rep,
            "repeat_loss": rep / n_rep if n_rep else math.nan, "recurring_tokens": n_rec,
            "recurring_loss": rec / n_rec if n_rec else math.nan,
            "bases": int(ws.token_bases(i)[counted_i].sum()) if hasattr(ws, "token_bases") else n}


def run_checkpoint(model: torch.nn.Module, ws: Any, n_windows: int, cfg: EvalConfig, max_context: int,
                   device: torch.device, advance: Any = None, parallel: EvalParallel | None = None
                   ) -> CheckpointResult:
    """Every window of the split through one model: position sums and per-window figures. With `parallel`
    (several ranks), the dp groups take turns over the batches and every rank gets all results in order."""
    length = position_length(ws, cfg.position)
    sums = PositionSums.zeros(length)
    table = torch.from_numpy(np.asarray(ws.counted)).to(device) if hasattr(ws, "counted") else None  # (vocab,)
    bins = WindowBins(bin_edges(length, cfg.bins, cfg.bin_scale))
    classes = distance_classes(position_length(ws, "bases"))
    recurring = np.zeros(len(classes) - 1, dtype=np.int64)  # (classes,)
    windows: list[dict[str, Any]] = []
    for batch in (parallel.batches(n_windows, cfg.batch_size) if parallel else _batches(n_windows, cfg.batch_size)):
        loss = counted = None
        if batch:
            arr = np.stack([np.asarray(ws[i]) for i in batch]).astype(np.int64)  # (B, L)
            ids = torch.from_numpy(arr).to(device)  # (B, L)
            loss, counted = token_losses(model, ids, max_context=max_context, precision=cfg.precision,
                                         parallel=parallel, counted_ids=table)
        results = parallel.gather(batch, loss, counted) if parallel else [
            (i, loss[j].cpu().numpy(), counted[j].cpu().numpy()) for j, i in enumerate(batch)]
        for i, loss_i, counted_i in results:  # loss_i, counted_i (L,)
            at_loss, at_counted, at_soft, at_bases, at_recur = _at_positions(ws, i, loss_i, counted_i,
                                                                             cfg.position, length)
            sums.add(at_loss, at_counted, at_bases)
            w_loss, w_count = bins.add(at_loss, at_counted, at_soft, at_bases, at_recur)  # (subsets, bins) each
            recurring += histogram(at_recur, at_counted, classes)
            windows.append(_window_record(ws, i, counted_i, w_loss, w_count))
        if advance is not None:
            advance(len(results))
    return CheckpointResult(sums, windows, bins, recurrence=(classes, recurring))


def check_finite(label: str, windows: list[dict[str, Any]]) -> None:
    """Refuse a checkpoint with a non-finite loss in any window: it would turn every figure of it into null."""
    if bad := [w["index"] for w in windows if w["tokens"] and not math.isfinite(w["loss"])]:
        raise LcftError(f"{label}: non-finite loss in {len(bad)} window(s) (first: window {bad[0]}): the model's "
                        "weights or its training diverged")


def run_probe(model: torch.nn.Module, probe: CopyProbe, cfg: EvalConfig, max_context: int, device: torch.device,
              advance: Any = None, parallel: EvalParallel | None = None) -> None:
    """Every planted window of `probe` through one model, its target losses recorded in `probe`. In one
    process a checkpoint cut to `max_context` runs only the pieces the target depends on."""
    first = probe.first_position(max_context) if parallel is None else 0  # cp shards need whole windows
    n = len(probe)
    for batch in (parallel.batches(n, cfg.batch_size) if parallel else _batches(n, cfg.batch_size)):
        loss = counted = None
        if batch:
            arr = np.stack([probe[k][first:] for k in batch]).astype(np.int64)  # (B, L - first)
            loss, counted = token_losses(model, torch.from_numpy(arr).to(device), max_context=max_context,
                                         precision=cfg.precision, parallel=parallel)
        results = parallel.gather(batch, loss, counted) if parallel else [
            (k, loss[j].cpu().numpy(), counted[j].cpu().numpy()) for j, k in enumerate(batch)]
        for k, loss_k, counted_k in results:  # (L - first,) ending at the window end, where the target is
            probe.record(k, loss_k, counted_k)
        if advance is not None:
            advance(len(results))


def make_probe(cfg: EvalConfig, ws: Any, n_windows: int) -> CopyProbe | None:
    """A fresh copy probe over the first windows (None without --probe); bad sizes fail before any work."""
    if cfg.probe == "none":
        return None
    distances = cfg.probe_distances or default_distances(ws.length, cfg.probe_segment)
    check_probe(ws.length, cfg.probe_segment, distances)
    n = min(cfg.probe_windows or n_windows, n_windows)
    return CopyProbe(ws, n, cfg.probe_segment, distances, cfg.probe_mutation, cfg.seed)


def check_launch(cfg: EvalConfig, world: int) -> None:
    """What a launch of `world` processes checks before it starts any or writes anything: the world splits
    into context-parallel groups, the split opens."""
    check_world(world, cfg.cp)
    open_split(cfg)


def evaluate(cfg: EvalConfig, *, progress: bool = False) -> dict[str, Any]:
    """Evaluate every checkpoint on the split, write eval.json, loss_by_position.csv/.png and eval.toml into
    `cfg.out` (nothing is written when an input is bad), and return the report (the content of eval.json).
    With `progress`, shows a progress bar over windows (print the table with terminal.print_table)."""
    from lcft.evaluate.report import build_report, write_outputs

    if cfg.multiprocess and not launched():
        raise ValueError("cfg asks for several processes (nproc, nnodes or max_restarts): run it through "
                         "lcft.launch.run('eval', cfg), which starts them")
    ws = open_split(cfg)
    tokenizer = ws.manifest.get("tokenizer", {})
    n_windows = len(ws) if not cfg.max_windows else min(cfg.max_windows, len(ws))
    make_probe(cfg, ws, n_windows)  # its sizes checked before any checkpoint is read
    infos = prepare_checkpoints(cfg, ws.length, tokenizer)
    device = _device(cfg.device)
    edges = bin_edges(position_length(ws, cfg.position), cfg.bins, cfg.bin_scale)
    parallel, lock = None, contextlib.ExitStack()
    try:
        if cfg.cp > 1 or launched():  # several ranks: windows sharded over cp, batches split over dp
            pcfg = ParallelConfig(cp=cfg.cp, cp_layout=cfg.cp_layout, cp_kv=cfg.cp_kv, collective_timeout=cfg.collective_timeout)
            parallel = EvalParallel(pcfg, device)
            for info in infos:
                parallel.check(ws.length, info.block_size(_default_block_size()), [info.max_context])
            progress = progress and parallel.is_main
        if parallel is None or parallel.is_main:
            lock.enter_context(folder_lock(cfg.out, "lcft eval"))  # one writer per output folder
        results = _run_all(cfg, ws, n_windows, infos, device, parallel, progress)
        report = build_report(cfg, ws, n_windows, infos, results, edges)
        if parallel is None or parallel.is_main:
            write_outputs(report, Path(cfg.out), cfg)
    finally:
        lock.close()
        if parallel is not None:  # after an error too: left to interpreter exit, gloo can abort the process
            parallel.close()
    return report


@contextlib.contextmanager
def progress_bar(show: bool) -> Iterator[Any]:
    """A rich progress bar over windows (one task per checkpoint), or None when not shown."""
    if not show:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("windows"), TimeRemainingColumn(), transient=False) as progress:
        yield progress


def _run_all(cfg: EvalConfig, ws: Any, n_windows: int, infos: list[CheckpointInfo], device: torch.device,
             parallel: EvalParallel | None, progress: bool) -> list[CheckpointResult]:
    """Every checkpoint in turn over the split, under one progress bar."""
    results: list[CheckpointResult] = []
    cached: tuple[Path, torch.nn.Module] | None = None
    with progress_bar(progress) as bar:
        for info in infos:
            # The same checkpoint listed twice (e.g. with and without --max-context) is loaded once.
            if cached is None or cached[0] != info.path:
                cached = None  # free the previous model before loading the next
                cached = (info.path, load_model(info, device))
                check_model_kernels_fit(cached[1].config, device, cfg.precision)  # before any window
                if parallel is not None:
                    parallel.prepare(cached[1])
            task = bar.add_task(info.label, total=n_windows) if bar else None
            advance = (lambda k, t=task: bar.advance(t, k)) if bar else None
            results.append(run_checkpoint(cached[1], ws, n_windows, cfg, info.max_context, device, advance,
                                          parallel))
            check_finite(info.label, results[-1].windows)  # before its probe runs
            probe = make_probe(cfg, ws, n_windows)
            if probe is not None:
                task = bar.add_task(f"{info.label}: copy probe", total=len(probe)) if bar else None
                advance = (lambda k, t=task: bar.advance(t, k)) if bar else None
                run_probe(cached[1], probe, cfg, info.max_context, device, advance, parallel)
                results[-1].probe = probe.checked(info.label)
    return results
