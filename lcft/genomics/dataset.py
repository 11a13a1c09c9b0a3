"""Training-side reader: deterministic sample order, aligned sub-windows, and (inputs, labels, weights) batches.

A *sample* is one aligned sub-window of `seq_len` tokens of a prepared window (window i, piece k covers tokens
[k·seq_len, (k+1)·seq_len) of it), so one prepared set serves a sequence-length warm-up. The order in which
samples are consumed is a pure function of (seed, epoch, global sample index): epoch e is a seeded permutation
of all samples, and global sample g is position g mod N of epoch g div N. The trainer's step s consumes global
samples [first, first + global_batch); each data-parallel rank takes its own slice of them, so a run can resume
on a different number of processes and still see the same samples in the same order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from lcft.errors import LcftError
from lcft.genomics.rc import flipped_sample, flips
from lcft.genomics.tokenizer import A, C, G, T
from lcft.shapes import check_batch, check_length

IGNORE_INDEX = -100  # HF convention: no loss at this label

# Label ids that carry loss with lcft's char vocabulary: the four bases (N, <unk> and the specials never do).
# A window set of a model tokenizer brings its own table (`counted`: tokens made only of A/C/G/T).
_COUNTED = np.zeros(256, dtype=bool)
_COUNTED[[A, C, G, T]] = True


class WindowSource(Protocol):
    """What `open_windows` returns, as far as training needs it."""

    length: int
    dtype: np.dtype  # of the stored ids

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...

    def ids(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray: ...

    def softmask(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class DataConfig:
    """How training samples are cut from prepared windows and weighted."""

    seq_len: int
    """Tokens per sample; must not exceed the window length (shorter takes aligned sub-windows)."""
    seed: int = 0
    """Seed of the per-epoch permutation."""
    softmask_loss_weight: float = 1.0
    """Loss weight of a label whose base was soft-masked (lower case) in the FASTA."""
    rc_augment: float = 0.0
    """Probability of reverse-complementing a sample (decided by seed and sample id; see lcft.genomics.rc)."""


class TrainSamples:
    """Samples of a window set in a seeded, resumable order, as model-ready tensors."""

    def __init__(self, windows: WindowSource, cfg: DataConfig) -> None:
        check_length(cfg.seq_len, what="--seq-len", window=windows.length)
        if cfg.seq_len < 2:
            raise LcftError(f"--seq-len must be at least 2 (got {cfg.seq_len})")
        if len(windows) == 0:
            raise LcftError("the data has no training windows")
        self.windows, self.cfg = windows, cfg
        self.counted: np.ndarray = getattr(windows, "counted", _COUNTED)  # (vocab,) bool: labels with loss
        self.label_bases = label_bases_table(windows, self.counted)  # (vocab,) int64: bases a counted label covers
        self.pieces = windows.length // cfg.seq_len  # aligned sub-windows per window (a shorter tail is unused)
        self.ids_dtype, self.labels_dtype = sample_dtypes(np.dtype(windows.dtype))
        self.num_samples = len(windows) * self.pieces

    @functools.lru_cache(maxsize=2)  # noqa: B019 - one object per run; the cache holds the current epochs
    def _permutation(self, epoch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.cfg.seed, epoch]))
        return rng.permutation(self.num_samples)  # (num_samples,)

    def sample_id(self, global_index: int) -> int:
        """The sample (window · pieces + piece) consumed at this global position of the run."""
        epoch, pos = divmod(int(global_index), self.num_samples)
        return int(self._permutation(epoch)[pos])

    def locate(self, sample_id: int) -> tuple[int, int]:
        """(window index, token offset inside the window) of a sample."""
        window, piece = divmod(int(sample_id), self.pieces)
        return window, piece * self.cfg.seq_len

    def example(self, sample_id: int) -> dict[str, np.ndarray]:
        """input_ids (L,) and labels (L,) in `sample_dtypes` of the windows' ids (the model and the loss widen
        them on the device); labels = next token, IGNORE_INDEX at N/<unk> and at the last position; weights (L,)
        float32 = softmask_loss_weight where the label's base was soft-masked."""
        window, off = self.locate(sample_id)
        L = self.cfg.seq_len
        if flips(self.cfg.seed, sample_id, self.cfg.rc_augment):
            ids, soft, real = flipped_sample(self.windows, window, off, L)  # (L,), (L,), tokens before padding
        else:
            ids = self.windows.ids(window, off, off + L)  # (L,) only the sample's tokens read
            soft, real = None, L
        ids = ids.astype(self.ids_dtype, copy=False)  # (L,) a copy only for ids torch cannot take as they are
        labels = np.full(L, IGNORE_INDEX, dtype=self.labels_dtype)  # (L,)
        nxt = ids[1:real]  # (real-1,) position i predicts token i+1 of the same sample
        np.copyto(labels[: nxt.size], nxt, where=self.counted[nxt])
        out = {"input_ids": ids, "labels": labels}
        if self.cfg.softmask_loss_weight != 1.0:
            if soft is None:
                soft = self.windows.softmask(window, off, off + L)  # (L,)
            weights = np.ones(L, dtype=np.float32)  # (L,)
            weights[:-1] = np.where(soft[1:], np.float32(self.cfg.softmask_loss_weight), np.float32(1.0))
            out["weights"] = weights
        return out

    def batch(self, sample_ids: list[int]) -> dict[str, torch.Tensor]:
        """Stacked examples: input_ids/labels (B, L) in `sample_dtypes`, weights (B, L) float32 when weighting is on."""
        examples = [self.example(s) for s in sample_ids]
        return {k: torch.from_numpy(np.stack([e[k] for e in examples])) for k in examples[0]}


def sample_dtypes(ids: np.dtype) -> tuple[np.dtype, np.dtype]:
    """(input_ids, labels) dtypes of samples of windows whose ids are `ids`: the narrowest that hold every id
    (labels also IGNORE_INDEX) and that torch takes on every device (uint8, or a signed type). Not int64: the
    model's embedding and the loss widen a batch on its device, and a 512K-token sample's int64 ids and labels
    made on the host would be 8 MiB written (and page-faulted) per sample."""
    labels = np.promote_types(ids, np.int8)  # uint8 -> int16, uint16 -> int32, uint32 -> int64
    return (ids if ids == np.uint8 else labels), labels


def counted_tokens(batch: dict[str, Any]) -> int:
    """Labels that carry loss in a batch (known before the forward, so the global normaliser is too)."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def label_bases_table(windows: Any, counted: np.ndarray) -> np.ndarray:
    """(vocab,) int64: the bases a counted label covers (a counted token spells only A/C/G/T, so its spelling's
    length is its base count: 1 for char, K for a K-mer), 0 for labels without loss."""
    tok = getattr(windows, "tokenizer", None) if getattr(windows, "per_base", False) else None
    if tok is None:
        return counted.astype(np.int64)
    lens = np.array([len(b) for b in tok.bases()], dtype=np.int64)  # (vocab,)
    out = np.zeros(counted.size, dtype=np.int64)
    out[: lens.size] = np.where(counted[: lens.size], lens, 0)
    return out


def counted_bases(batch: dict[str, Any], table: np.ndarray) -> int:
    """Bases covered by the labels that carry loss in a batch (the denominator of bits per base)."""
    labels = batch["labels"].numpy() if hasattr(batch["labels"], "numpy") else np.asarray(batch["labels"])
    return int(table[labels[labels != IGNORE_INDEX]].sum())


def batch_counts(batches: list[dict[str, Any]], table: np.ndarray) -> list[float]:
    """[counted tokens, bases they cover] over a step's batches (`table`: TrainSamples.label_bases)."""
    return [float(sum(counted_tokens(b) for b in batches)), float(sum(counted_bases(b, table) for b in batches))]


def step_indices(first: int, global_batch: int, micro_batch: int, dp_rank: int, dp_size: int) -> list[list[int]]:
    """Global sample indices this data-parallel rank uses in one optimizer step, per accumulation micro-step.

    Position j of the step's global batch goes to micro-step j // (dp_size·micro_batch), rank
    (j // micro_batch) mod dp_size: so 2 ranks x micro-batch 1 and 1 rank x 2 micro-steps read the same samples.
    """
    per_round = micro_batch * dp_size
    out = []
    for a in range(check_batch(global_batch, micro_batch, dp_size)):
        base = first + a * per_round + dp_rank * micro_batch
        out.append(list(range(base, base + micro_batch)))
    return out
