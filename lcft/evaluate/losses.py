"""`token_losses`: per-token held-out loss of whole windows through one model, aligned to the predicted token;
`window_losses`: those of many windows, batch by batch, one window at a time in order."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lcft.genomics.dataset import sample_dtypes
from lcft.genomics.tokenizer import A, T

if TYPE_CHECKING:
    from lcft.evaluate.config import EvalConfig
    from lcft.evaluate.parallel import EvalParallel
    from lcft.evaluate.store import LossStore
    from lcft.signals import StopSignals

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
    """Per-token loss of whole windows `ids` `(B, L)` (any integer dtype: the windows' narrow ids are widened
    here, on their device), aligned to the predicted token's position.

    Returns `loss (B, L)` fp32 and `counted (B, L)` bool: entry p is the loss of predicting token p from the
    tokens before it (p = 0 and N/<unk> targets are not counted, their loss is 0). With `max_context` C > 0
    each window is cut into independent pieces of C tokens, each run with positions 0..C-1, so token p sees
    only the tokens of its own piece (the last token of a piece still predicts the first of the next one
    from its own piece's context, so every window gets the same counted positions with or without a limit).
    """
    from lcft.kernels import per_token_loss

    b, length = ids.shape
    ids = ids.long()  # the labels need a signed type, and a uint8 index would read as a mask; a no-op on int64
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


def host_batch(windows: list[np.ndarray]) -> torch.Tensor:
    """Windows `(L,)` each stacked as one batch `(B, L)` in the narrow dtype of their ids that training's samples
    use (`sample_dtypes`: uint8 for char), not int64: a 1M-token window is 1 MiB on the host, not 8, and
    `token_losses` widens it on the device."""
    stacked = np.stack(windows)  # (B, L)
    return torch.from_numpy(stacked.astype(sample_dtypes(stacked.dtype)[0], copy=False))


def batches(n: int, size: int, start: int = 0) -> Iterator[list[int]]:
    """Indices start..n-1 in batches of `size`, in order: one process's batches (EvalParallel.batches splits
    them over dp groups). `start` is a multiple of `size` (or n): the batches are those of a run from 0."""
    for s in range(start, n, size):
        yield list(range(s, min(s + size, n)))


class Interrupted(Exception):
    """Signal `signum` ended the evaluation between two batches (every rank at the same one), their losses kept."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def window_losses(model: torch.nn.Module, n: int, window: Callable[[int], np.ndarray], cfg: EvalConfig,
                  max_context: int, device: torch.device, advance: Callable[[int], Any] | None = None,
                  parallel: EvalParallel | None = None, counted_ids: torch.Tensor | None = None,
                  store: LossStore | None = None, stop: StopSignals | None = None
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(i, loss (L,), counted (L,)) of windows 0..n-1 through one model in order, `window(i)` giving window i's
    token ids (L,): batches of --batch-size through `token_losses`, `advance(k)` after each batch's k windows.
    With `parallel` (several ranks), the dp groups take turns over the batches and every rank gets all windows.
    With `store` (the main rank's), the items it kept from a killed run are read back (and handed to every
    rank) instead of computed, and each computed item is added to it. Once `stop` has noted a signal on any
    rank, every rank raises Interrupted after the same batch (the signal of the highest number, if several)."""
    start = store.resume_at(n, cfg.batch_size) if store is not None else 0
    if parallel is not None:
        start = parallel.share(start)
    for item in store.items(start) if store is not None else (None for _ in range(start)):
        yield parallel.share(item) if parallel is not None else item
    if advance is not None and start:
        advance(start)
    todo = parallel.batches(n, cfg.batch_size, start) if parallel else batches(n, cfg.batch_size, start)
    for batch in todo:
        loss = counted = None
        if batch:  # a rank with no batch this round still joins the gather below, so the collectives match
            ids = host_batch([window(i) for i in batch]).to(device)  # (B, L) narrow, widened by token_losses
            loss, counted = token_losses(model, ids, max_context=max_context, precision=cfg.precision,
                                         parallel=parallel, counted_ids=counted_ids)  # (B, L) each
        results = parallel.gather(batch, loss, counted) if parallel else [
            (i, loss[j].cpu().numpy(), counted[j].cpu().numpy()) for j, i in enumerate(batch)]  # (L,) each
        if store is not None:
            for item in results:
                store.add(*item)
        yield from results
        if advance is not None:  # runs once the caller has taken the batch's last window
            advance(len(results))
        if stop is not None and (signum := stop.agreed(parallel.max if parallel else None)):
            raise Interrupted(signum)
