"""The held-out split through one checkpoint: every window's per-token loss reduced by position (`run_checkpoint`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lcft.errors import LcftError
from lcft.evaluate.binning import PositionSums, WindowBins, at_base_offsets, bin_edges, to_base_positions
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.losses import window_losses
from lcft.evaluate.probe import CopyProbe
from lcft.evaluate.recurrence import distance_classes, histogram, nearest_copy, token_distances, window_codes

if TYPE_CHECKING:
    from lcft.evaluate.parallel import EvalParallel
    from lcft.evaluate.store import LossStore
    from lcft.signals import StopSignals


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
                   device: torch.device, advance: Any = None, parallel: EvalParallel | None = None,
                   store: LossStore | None = None, stop: StopSignals | None = None) -> CheckpointResult:
    """Every window of the split through one model: position sums and per-window figures. With `parallel`
    (several ranks), the dp groups take turns over the batches and every rank gets all results in order.
    With `store`, the windows of a killed run are read back from it and the others added; `stop` ends it between
    two batches (`window_losses`)."""
    length = position_length(ws, cfg.position)
    sums = PositionSums.zeros(length)
    table = torch.from_numpy(np.asarray(ws.counted)).to(device) if hasattr(ws, "counted") else None  # (vocab,)
    bins = WindowBins(bin_edges(length, cfg.bins, cfg.bin_scale))
    classes = distance_classes(position_length(ws, "bases"))
    recurring = np.zeros(len(classes) - 1, dtype=np.int64)  # (classes,)
    windows: list[dict[str, Any]] = []
    for i, loss_i, counted_i in window_losses(model, n_windows, lambda i: np.asarray(ws[i]), cfg, max_context,
                                              device, advance, parallel, counted_ids=table, store=store,
                                              stop=stop):  # (L,) each
        at_loss, at_counted, at_soft, at_bases, at_recur = _at_positions(ws, i, loss_i, counted_i, cfg.position,
                                                                         length)
        sums.add(at_loss, at_counted, at_bases)
        w_loss, w_count = bins.add(at_loss, at_counted, at_soft, at_bases, at_recur)  # (subsets, bins) each
        recurring += histogram(at_recur, at_counted, classes)
        windows.append(_window_record(ws, i, counted_i, w_loss, w_count))
    return CheckpointResult(sums, windows, bins, recurrence=(classes, recurring))


def check_finite(label: str, windows: list[dict[str, Any]]) -> None:
    """Refuse a checkpoint with a non-finite loss in any window: it would turn every figure of it into null."""
    if bad := [w["index"] for w in windows if w["tokens"] and not math.isfinite(w["loss"])]:
        raise LcftError(f"{label}: non-finite loss in {len(bad)} window(s) (first: window {bad[0]}): the model's "
                        "weights or its training diverged")
