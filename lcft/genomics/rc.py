"""Reverse-complement augmentation of training samples: which samples flip, and their tokens once flipped.

A sample flips with probability P, decided by (seed, sample id) alone, so a resumed run flips the same ones.
char: ids reversed and complemented (O(L), no tokenizer). Model tokenizers: the bases from the window's start to
the sample's end, reverse-complemented (soft mask kept), tokenized again with the documented piece rule (pieces
counted from the flipped sequence's start), first L tokens; costs one tokenization of those bases per sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lcft.genomics import tokenizer as char_vocab
from lcft.genomics.seq_tokenizer import UPPER, prefix_counts

RC_STREAM = 0x5243  # 'RC': keeps the flip draws apart from the permutation's (same seed)
_CHAR_COMPLEMENT = np.arange(256, dtype=np.uint8)  # char ids are uint8
_CHAR_COMPLEMENT[[char_vocab.A, char_vocab.C, char_vocab.G, char_vocab.T]] = [char_vocab.T, char_vocab.G,
                                                                               char_vocab.C, char_vocab.A]
_BASE_COMPLEMENT = str.maketrans("ACGTacgt", "TGCAtgca")


def flips(seed: int, sample_id: int, p: float) -> bool:
    """Whether this sample is reverse-complemented (probability p, a pure function of seed and sample id)."""
    if p <= 0.0:
        return False
    return bool(np.random.Generator(np.random.PCG64([seed, RC_STREAM, int(sample_id)])).random() < p)


def reverse_complement_text(seq: str) -> str:
    """Reverse complement, case kept (letters other than A/C/G/T are kept as they are)."""
    return seq.translate(_BASE_COMPLEMENT)[::-1]


def flipped_sample(windows: Any, window: int, off: int, length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(length,) ids (the windows' dtype), (length,) bool soft mask and the number of real tokens of the
    reverse-complemented sample at tokens [off, off + length) of `window`. A model tokenizer may yield fewer than `length` tokens (only
    for a sample at the window's start): the rest is id 0, and the caller gives those positions no loss."""
    if not getattr(windows, "per_base", False):  # char: one token per base, only the sample's tokens read
        ids = windows.ids(window, off, off + length)  # (length,)
        return _CHAR_COMPLEMENT[ids[::-1]], windows.softmask(window, off, off + length)[::-1].copy(), length
    end = int(windows.base_offsets(window)[off + length - 1] + windows.token_bases(window)[off + length - 1])
    flipped = reverse_complement_text(windows.sequence(window)[:end])  # bases [0, end) of the window, flipped
    raw = np.frombuffer(flipped.encode("latin-1"), dtype=np.uint8)  # (end,)
    tok = windows.tokenizer
    new_ids, counts = tok.encode_chunk(UPPER[raw], tok.pieces(raw, 0))
    lower = prefix_counts(raw >= ord("a"))  # (end+1,)
    ends = np.cumsum(counts)  # (n_tok,)
    new_soft = (2 * (lower[ends] - lower[ends - counts]) >= counts) & (counts > 0)  # at least half lower case
    out_ids = np.zeros(length, dtype=windows.dtype)  # (length,)
    out_soft = np.zeros(length, dtype=bool)  # (length,)
    n = min(length, new_ids.size)
    out_ids[:n], out_soft[:n] = new_ids[:n], new_soft[:n]
    return out_ids, out_soft, n
