"""Fixed-length windows over one chromosome: start positions, streamed tokenization, N and GC fractions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from lcft.genomics.fasta import FastaFile
from lcft.genomics.tokenizer import A, C, G, T, encode_lines

DEFAULT_CHUNK = 1 << 23  # bases read per pyfaidx request: 8 Mbp keeps memory small and syscalls few


def window_starts(chrom_len: int, length: int, stride: int) -> range:
    """0-based starts of every full window (a chromosome tail shorter than `length` gives no window)."""
    if chrom_len < length:
        return range(0)
    return range(0, chrom_len - length + 1, stride)


@dataclass(frozen=True)
class Window:
    """One cut window: its coordinates, token ids and soft-mask bytes (0/1), and composition."""

    chrom: str
    start: int
    end: int
    ids: bytes
    softmask: bytes
    n_frac: float
    gc_frac: float


def composition(ids: bytes, lo: int = 0, hi: int | None = None) -> tuple[int, int, int]:
    """(bases, non-ACGT count, G+C count) of ids[lo:hi] without copying (bytes.count takes bounds)."""
    hi = len(ids) if hi is None else hi
    a, c, g, t = (ids.count(bytes((tok,)), lo, hi) for tok in (A, C, G, T))
    return hi - lo, (hi - lo) - (a + c + g + t), c + g


def iter_windows(
    fasta: FastaFile, chrom: str, length: int, stride: int, chunk: int = DEFAULT_CHUNK
) -> Iterator[tuple[Window, int]]:
    """Every window of `chrom` in order, with the number of bases of the chromosome consumed so far
    (for progress). Reads groups of windows that together span about `chunk` bases, so memory is
    O(max(chunk, length)) whatever the chromosome length."""
    n = fasta.length(chrom)
    starts = window_starts(n, length, stride)
    per_batch = max(1, (max(chunk, length) - length) // stride + 1)
    for b0 in range(0, len(starts), per_batch):
        batch = starts[b0 : b0 + per_batch]
        lo, hi = batch[0], batch[-1] + length
        ids, soft = encode_lines(fasta.read_raw(chrom, lo, hi))
        if len(ids) != hi - lo:
            raise ValueError(f"{chrom}:{lo}-{hi}: read {len(ids)} bases, expected {hi - lo}")
        for s in batch:
            off = s - lo
            bases, n_count, gc = composition(ids, off, off + length)
            acgt = bases - n_count
            yield (
                Window(
                    chrom=chrom,
                    start=s,
                    end=s + length,
                    ids=ids[off : off + length],
                    softmask=soft[off : off + length],
                    n_frac=n_count / length,
                    gc_frac=gc / acgt if acgt else 0.0,
                ),
                min(s + stride, n) if s != starts[-1] else n,
            )


def chromosome_stats(fasta: FastaFile, chrom: str, chunk: int = DEFAULT_CHUNK) -> dict:
    """Length, N fraction, soft-masked fraction and GC fraction (of A/C/G/T bases) of one record, streamed."""
    total = n_count = gc = lower = 0
    for _, raw in fasta.chunks(chrom, chunk):
        ids, soft = encode_lines(raw)
        bases, nn, g = composition(ids)
        total, n_count, gc = total + bases, n_count + nn, gc + g
        lower += soft.count(1)
    acgt = total - n_count
    return {
        "chrom": chrom,
        "length": total,
        "n_frac": n_count / total if total else 0.0,
        "softmask_frac": lower / total if total else 0.0,
        "gc_frac": gc / acgt if acgt else 0.0,
    }
