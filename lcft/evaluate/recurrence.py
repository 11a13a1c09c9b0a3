"""In-window recurrence: for each base, how far back the k-mer ending at it last occurred in the same window."""

from __future__ import annotations

from typing import Any

import numpy as np

from lcft.genomics.seq_tokenizer import prefix_counts
from lcft.vocab import A, C, G, T

K = 20
"""Bases of the k-mer that must recur: at 20 bases a chance match in a 1M-base window is rare (4^20 ~ 1e12
k-mers), so a recurring 20-mer marks a copy (a repeat, a duplication) that long context can read back."""

DISTANCE_EDGES = (1, 16, 256, 4096, 65536, 1048576)
"""Distance classes (bases back to the nearest earlier occurrence) of the distance histogram; the last class
is open-ended."""

_ASCII = np.full(256, 4, dtype=np.uint8)  # ASCII letter -> 0..3 for A/C/G/T (either case), 4 for any other
_IDS = np.full(256, 4, dtype=np.uint8)  # char-tokenizer id -> 0..3 for A/C/G/T, 4 for N and specials
for _code, (_letter, _id) in enumerate(zip("ACGT", (A, C, G, T), strict=True)):
    _ASCII[ord(_letter)] = _ASCII[ord(_letter.lower())] = _code
    _IDS[_id] = _code


def ascii_codes(seq: str | bytes | np.ndarray) -> np.ndarray:
    """(n,) uint8: 0..3 for A/C/G/T of sequence text (either case), 4 for N or any other letter."""
    raw = np.frombuffer(seq.encode("ascii") if isinstance(seq, str) else bytes(seq), dtype=np.uint8)
    return _ASCII[raw]


def window_codes(ws: Any, i: int) -> np.ndarray:
    """(bases,) uint8 codes of window i's bases (see ascii_codes), for char windows or a model tokenizer's."""
    if getattr(ws, "per_base", False):  # tokens of several bases: spelled back from the vocabulary
        return _ASCII[ws.tokenizer.spell(np.asarray(ws[i], dtype=np.int64), ws.token_bases(i))]
    ids = np.asarray(ws[i])  # (L,) one base per token
    return np.where(ids < 256, _IDS[np.minimum(ids, 255)], 4).astype(np.uint8)


def nearest_copy(codes: np.ndarray, k: int = K) -> np.ndarray:
    """(n,) int64: for each base i, i - j for the latest j < i where the k-mer ending at j equals the k-mer
    ending at i; 0 when it has not occurred earlier, when i < k - 1, or when the k-mer holds a base that is
    not A/C/G/T. Exact (k-mers packed 2 bits a base into an int64), O(n log n) in numpy."""
    if not 1 <= k <= 31:
        raise ValueError(f"k must be 1..31 (2 bits a base in an int64), got {k}")
    codes = np.asarray(codes, dtype=np.uint8)
    n = len(codes)
    out = np.zeros(n, dtype=np.int64)
    if n < k:
        return out
    m = n - k + 1  # k-mers, the j-th ending at base j + k - 1
    key = np.zeros(m, dtype=np.int64)  # (m,)
    for t in range(k):  # k vector passes: a rolling 2-bit packing of each k-mer
        key = (key << 2) | (codes[t:t + m] & 3).astype(np.int64)
    bad = prefix_counts(codes > 3)  # (n + 1,) non-ACGT bases before each position
    ok = bad[k:] == bad[:m]  # (m,) k-mers of A/C/G/T only
    where = np.flatnonzero(ok)  # (m_ok,) increasing k-mer index
    order = np.argsort(key[where], kind="stable")  # equal keys keep their position order
    sk, sp = key[where][order], where[order]  # (m_ok,) sorted keys and their positions
    same = np.flatnonzero(sk[1:] == sk[:-1]) + 1  # entries whose predecessor has the same k-mer
    out[sp[same] + k - 1] = sp[same] - sp[same - 1]
    return out


def token_distances(base_distance: np.ndarray, token_bases: np.ndarray | None) -> np.ndarray:
    """(L,) int64 per token: the nearest-copy distance of the k-mer ending at the token's last base (a token
    recurs when the bases up to its end occurred earlier); `token_bases` (L,) bases per token (None: one)."""
    if token_bases is None:
        return np.asarray(base_distance, dtype=np.int64)
    counts = np.asarray(token_bases, dtype=np.int64)  # (L,)
    last = np.cumsum(counts) - 1  # (L,) base index of each token's last base
    return np.where(counts > 0, np.asarray(base_distance)[np.maximum(last, 0)], 0).astype(np.int64)


def distance_classes(length: int) -> np.ndarray:
    """Edges of the distance histogram for windows of `length` bases: DISTANCE_EDGES up to the first at or
    beyond the window (a copy is never farther back than the window)."""
    edges = [e for e in DISTANCE_EDGES if e < length]
    return np.array([*edges, max(length, 2)], dtype=np.int64)


def histogram(distance: np.ndarray, counted: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(classes,) int64: counted tokens whose nearest copy lies in [edges[c], edges[c + 1]) bases back (the
    last class also takes anything farther)."""
    d = np.asarray(distance)[np.asarray(counted, dtype=bool) & (np.asarray(distance) > 0)]  # (recurring,)
    classes = len(edges) - 1
    at = np.clip(np.searchsorted(edges, d, side="right") - 1, 0, classes - 1)  # (recurring,) class of each
    return np.bincount(at, minlength=classes).astype(np.int64)
