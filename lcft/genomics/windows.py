"""Fixed-length windows over one chromosome: start positions, streamed tokenization, N and GC fractions."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from lcft.errors import LcftError, reason
from lcft.genomics.fasta import FastaFile
from lcft.genomics.tokenizer import FLAG_GC, FLAG_LOWER, FLAG_NOT_ACGT, ID_BITS, encode_lines, encode_pieces

DEFAULT_CHUNK = 1 << 21  # bases per read: 2 Mbp keeps the working set near the CPU caches


def window_starts(chrom_len: int, length: int, stride: int) -> range:
    """0-based starts of every full window (a chromosome tail shorter than `length` gives no window)."""
    if chrom_len < length:
        return range(0)
    return range(0, chrom_len - length + 1, stride)


class Window:
    """One cut window: coordinates, composition, and (computed on demand, so windows dropped by the N
    filter cost nothing more) its token ids and bit-packed soft mask. `coded` is a view of the reader's
    buffer, reused for the next group of windows: use a window before drawing the next group's."""

    __slots__ = ("chrom", "start", "end", "coded", "n_count", "_scratch")

    def __init__(self, chrom: str, start: int, coded: np.ndarray, scratch: np.ndarray | None = None) -> None:
        self.chrom, self.start, self.end = chrom, start, start + coded.size
        self.coded = coded  # (L,) uint8 id | flags (tokenizer.encode_lines)
        # (L,) uint8 reused by the bit tests: a fresh temporary of L bytes would cost page faults each time
        self._scratch = np.empty_like(coded) if scratch is None else scratch
        self.n_count = self._count(FLAG_NOT_ACGT)  # N, ambiguity codes, unknown bytes

    def _count(self, flag: int) -> int:
        return int(np.count_nonzero(np.bitwise_and(self.coded, flag, out=self._scratch)))

    @property
    def n_frac(self) -> float:
        return self.n_count / self.coded.size

    @property
    def gc_frac(self) -> float:
        """G+C share of the A/C/G/T bases (0 when there are none)."""
        acgt = self.coded.size - self.n_count
        return self._count(FLAG_GC) / acgt if acgt else 0.0

    def fill(self, ids: np.ndarray, softmask_packed: np.ndarray) -> None:
        """Write the token ids and the soft mask (np.packbits, big bit order) into (L,) and (L/8,) uint8 buffers."""
        np.bitwise_and(self.coded, ID_BITS, out=ids)
        softmask_packed[:] = np.packbits(np.bitwise_and(self.coded, FLAG_LOWER, out=self._scratch))


def iter_windows(
    fasta: FastaFile, chrom: str, length: int, stride: int, chunk: int = DEFAULT_CHUNK
) -> Iterator[tuple[Window, int]]:
    """Every window of `chrom` in order, with the number of bases of the chromosome consumed so far
    (for progress). Reads groups of windows that together span about `chunk` bases into one reused
    buffer, so memory is O(max(chunk, length)) whatever the chromosome length. A window is valid until
    the next group is read. `length` must be a multiple of 8."""
    n = fasta.length(chrom)
    starts = window_starts(n, length, stride)
    if not starts:
        return
    per_batch = max(1, (max(chunk, length) - length) // stride + 1)
    span = min((per_batch - 1) * stride + length, starts[-1] + length)
    buffer = np.empty(span, dtype=np.uint8)  # reused: a fresh one per group would cost page faults each time
    scratch = np.empty(length, dtype=np.uint8)
    bases_per_line = fasta.line_bytes(chrom)[0]
    for b0 in range(0, len(starts), per_batch):
        batch = starts[b0 : b0 + per_batch]
        lo, hi = batch[0], batch[-1] + length
        coded = buffer[: hi - lo]  # (hi-lo,) id | flags of this group of windows
        try:
            got = encode_pieces(fasta.line_pieces(chrom, lo, hi), bases_per_line, coded)
        except ValueError as e:  # also numpy's "could not broadcast" when a piece overflows the buffer
            raise LcftError(f"{fasta.path}: {chrom}:{lo}-{hi}: {reason(e)} (changed since indexing?)") from None
        if got != hi - lo:
            raise LcftError(f"{fasta.path}: {chrom}:{lo}-{hi} gave {got} bases, expected {hi - lo}")
        for s in batch:
            win = Window(chrom, s, coded[s - lo : s - lo + length], scratch)
            yield win, (min(s + stride, n) if s != starts[-1] else n)


def chromosome_stats(fasta: FastaFile, chrom: str, chunk: int = DEFAULT_CHUNK) -> dict:
    """Length, N fraction, soft-masked fraction and GC fraction (of A/C/G/T bases) of one record, streamed."""
    total = n_count = gc = lower = 0
    for _, raw in fasta.chunks(chrom, chunk):
        coded = encode_lines(raw)  # (chunk,) id | flags
        total += coded.size
        n_count += int(np.count_nonzero(coded & FLAG_NOT_ACGT))
        gc += int(np.count_nonzero(coded & FLAG_GC))
        lower += int(np.count_nonzero(coded & FLAG_LOWER))
    acgt = total - n_count
    return {
        "chrom": chrom,
        "length": total,
        "n_frac": n_count / total if total else 0.0,
        "softmask_frac": lower / total if total else 0.0,
        "gc_frac": gc / acgt if acgt else 0.0,
    }
