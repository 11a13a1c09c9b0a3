"""`evaluate(cfg)`: per-token held-out loss through each checkpoint, reduced by position, written as a report."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcft.errors import LcftError
from lcft.evaluate.binning import PositionSums, bin_edges
from lcft.evaluate.checkpoints import CheckpointInfo, check_weights_readable, default_labels, weights_sha256
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.parallel import EvalParallel
from lcft.files import folder_lock
from lcft.genomics.tokenizer import A, T
from lcft.kernels.triton_tiles import check_model_kernels_fit
from lcft.launch import launch, launched
from lcft.parallel.config import ParallelConfig

IGNORE = -100


def window_labels(ids: torch.Tensor) -> torch.Tensor:
    """Next-token labels `(B, L)` int64 for windows `ids` `(B, L)`: label[t] = ids[t+1] when it is a base
    A/C/G/T, else -100 (N and <unk> are never a label); the last position predicts nothing."""
    nxt = ids[:, 1:]  # (B, L-1)
    valid = (nxt >= A) & (nxt <= T)
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
                 precision: str = "fp32", parallel: EvalParallel | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss of whole windows `ids` `(B, L)`, aligned to the predicted token's position.

    Returns `loss (B, L)` fp32 and `counted (B, L)` bool: entry p is the loss of predicting token p from the
    tokens before it (p = 0 and N/<unk> targets are not counted, their loss is 0). With `max_context` C > 0
    each window is cut into independent pieces of C tokens, each run with positions 0..C-1, so token p sees
    only the tokens of its own piece (the last token of a piece still predicts the first of the next one
    from its own piece's context, so every window gets the same counted positions with or without a limit).
    """
    from lcft.kernels import per_token_loss

    b, length = ids.shape
    labels = window_labels(ids)  # (B, L)
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
                loss = parallel.piece_losses(model, x, y, pos)  # (B * n, C)
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


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise LcftError(f"unknown device {name!r} (auto, cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LcftError(f"device {name} asked for, but CUDA is not available")
    return dev


def load_model(info: CheckpointInfo, device: torch.device) -> torch.nn.Module:
    """The checkpoint's model in eval mode on `device`; any read failure is a user error naming the folder."""
    from lcft.parallel.dcp import read_model  # safetensors or a sharded (DCP) checkpoint

    try:
        model = read_model(info.path)
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


def run_checkpoint(model: torch.nn.Module, ws: Any, n_windows: int, cfg: EvalConfig, max_context: int,
                   device: torch.device, advance: Any = None, parallel: EvalParallel | None = None
                   ) -> CheckpointResult:
    """Every window of the split through one model: position sums and per-window figures. With `parallel`
    (several ranks), the dp groups take turns over the batches and every rank gets all results in order."""
    sums = PositionSums.zeros(ws.length)
    windows: list[dict[str, Any]] = []
    for batch in (parallel.batches(n_windows, cfg.batch_size) if parallel else _batches(n_windows, cfg.batch_size)):
        loss = counted = None
        if batch:
            arr = np.stack([np.asarray(ws[i]) for i in batch]).astype(np.int64)  # (B, L)
            ids = torch.from_numpy(arr).to(device)  # (B, L)
            loss, counted = token_losses(model, ids, max_context=max_context, precision=cfg.precision,
                                         parallel=parallel)
        results = parallel.gather(batch, loss, counted) if parallel else [
            (i, loss[j].cpu().numpy(), counted[j].cpu().numpy()) for j, i in enumerate(batch)]
        for i, loss_i, counted_i in results:  # loss_i, counted_i (L,)
            sums.add(loss_i, counted_i)
            n = int(counted_i.sum())
            total = float(loss_i[counted_i].sum(dtype=np.float64))
            chrom, start, end = ws.coords(i)
            windows.append({"index": i, "chrom": chrom, "start": int(start), "end": int(end),
                            "tokens": n, "loss": total / n if n else math.nan})
        if advance is not None:
            advance(len(results))
    return CheckpointResult(sums, windows)


def evaluate(cfg: EvalConfig, *, progress: bool = False) -> dict[str, Any]:
    """Evaluate every checkpoint on the split, write eval.json, loss_by_position.csv/.png and eval.toml into
    `cfg.out` (nothing is written when an input is bad), and return the report (the content of eval.json).
    With `progress`, shows a progress bar over windows (print the table with report.print_table)."""
    from lcft.evaluate.report import build_report, write_outputs

    if cfg.multiprocess and not launched():
        return launch("eval", cfg)  # torchrun starts the ranks; they run this function again
    ws = open_split(cfg)
    tokenizer = ws.manifest.get("tokenizer", {})
    infos = prepare_checkpoints(cfg, ws.length, tokenizer)
    n_windows = len(ws) if not cfg.max_windows else min(cfg.max_windows, len(ws))
    device = _device(cfg.device)
    edges = bin_edges(ws.length, cfg.bins, cfg.bin_scale)
    parallel, lock = None, contextlib.ExitStack()
    try:
        if cfg.cp > 1 or launched():  # several ranks: windows sharded over cp, batches split over dp
            pcfg = ParallelConfig(cfg.cp, cfg.cp_layout, cfg.cp_kv, collective_timeout=cfg.collective_timeout)
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


def _run_all(cfg: EvalConfig, ws: Any, n_windows: int, infos: list[CheckpointInfo], device: torch.device,
             parallel: EvalParallel | None, progress: bool) -> list[CheckpointResult]:
    """Every checkpoint in turn over the split, under one progress bar."""
    from lcft.evaluate.report import progress_bar

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
    return results
