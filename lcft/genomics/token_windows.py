"""Windows of L model tokens over one chromosome (k-mer and tokenizer.json vocabularies), streamed.

The record is read in chunks, cut into pieces (`SeqTokenizer.pieces`), tokenized, and the token stream
is cut into windows of `length` tokens every `stride` tokens. Each token keeps its number of bases, so a window
knows its base span; per-token soft mask and N rules are in `_Tokens.append`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from lcft.errors import LcftError, reason
from lcft.genomics.fasta import FastaFile
from lcft.genomics.seq_tokenizer import UPPER, SeqTokenizer, acgt_mask, prefix_counts
from lcft.genomics.tokenizer import encode_pieces

DEFAULT_CHUNK = 1 << 21  # bases per read (a multiple of the tokenizer.json block size)
IDENTITY = bytes(range(256))  # translate table that keeps the bytes (line breaks are dropped by position)
MAX_BASES_PER_TOKEN = np.iinfo(np.uint16).max
_GC = np.zeros(256, dtype=bool)
_GC[[ord(c) for c in "CGcg"]] = True


@dataclass
class TokenWindow:
    """One window: L tokens, their bases per token and soft-mask bits, the bases of its span as stored."""

    chrom: str
    start: int
    end: int
    ids: np.ndarray  # (L,) int64
    counts: np.ndarray  # (L,) int64 bases per token
    soft: np.ndarray  # (L,) bool token soft-masked
    bases: np.ndarray  # (end-start,) uint8 the span's bytes (case kept; lower case = soft-masked)
    non_acgt: int  # bases that are not A/C/G/T
    gc: int
    oov: int  # tokens that are the unknown token

    @property
    def n_frac(self) -> float:
        return self.non_acgt / max(self.end - self.start, 1)

    @property
    def gc_frac(self) -> float:
        acgt = self.end - self.start - self.non_acgt
        return self.gc / acgt if acgt else 0.0

    def arrays(self, dtype: np.dtype) -> tuple[np.ndarray, ...]:
        """What the four files of a split get: ids (L,) dtype, token soft mask (L/8,) packed, bases per token
        (L,) uint16, base soft mask (ceil(span/8),) packed (np.packbits, big bit order)."""
        lower = self.bases >= ord("a")  # (span,)
        return (self.ids.astype(dtype), np.packbits(self.soft), self.counts.astype(np.uint16), np.packbits(lower))

    def letters_behind(self, unk: int | None) -> Counter:
        """The letters other than A/C/G/T behind the window's unknown tokens (not the A/C/G/T beside them in an
        unknown k-mer), upper-cased."""
        if unk is None or not self.oov:
            return Counter()
        behind = UPPER[self.bases[np.repeat(self.ids == unk, self.counts)]]
        return Counter(behind[~acgt_mask(behind)].tobytes().decode("latin-1"))


class _Tokens:
    """The part of a chromosome's token stream not yet cut into windows (bounded by chunk + window)."""

    def __init__(self, unk: int | None) -> None:
        self.unk = -1 if unk is None else unk
        self.t0 = 0  # stream index of the first kept token
        self.lb0 = 0  # record position of the first kept base of `bases`
        empty_i, empty_b = np.zeros(0, np.int64), np.zeros(0, bool)
        self.ids, self.counts, self.first, self.non_acgt, self.gc = (empty_i,) * 5
        self.soft, self.oov = empty_b, empty_b
        self.bases = np.zeros(0, np.uint8)  # record bytes from `lb0` on: windows take their span's from here

    @property
    def end(self) -> int:
        return self.t0 + self.ids.size

    def append(self, raw: np.ndarray, at: int, ids: np.ndarray, counts: np.ndarray) -> None:
        """Add the tokens of raw bytes `raw` (record positions [at, at + raw.size)).

        Rules: a token of other letters (or a k-mer holding one) carries no loss (its id is not counted, see
        SeqTokenizer.counted), and its bases other than A/C/G/T count toward the window's N share. A token is
        soft-masked when at least half its bases are lower case: repeat annotations run for hundreds of bases,
        so few tokens straddle an edge, and the majority keeps the masked share of tokens close to that of bases
        (any-base would over-count every edge, all-bases would under-count)."""
        if counts.size and counts.max() > MAX_BASES_PER_TOKEN:
            raise LcftError(f"a token covers {counts.max()} bases (more than {MAX_BASES_PER_TOKEN})")
        ends = np.cumsum(counts)  # (n_tok,) chunk offset after each token
        starts = ends - counts  # (n_tok,)
        if ends.size and ends[-1] != raw.size:
            raise LcftError(f"tokens cover {ends[-1]} bases of a {raw.size}-base chunk")
        low_cs = prefix_counts(raw >= ord("a"))  # (n+1,) lower-case bases before each offset
        gc_cs = prefix_counts(_GC[raw])  # (n+1,)
        other_cs = prefix_counts(~acgt_mask(raw))  # (n+1,) bases not A/C/G/T before each offset
        oov = ids == self.unk  # (n_tok,)
        lows = low_cs[ends] - low_cs[starts]  # (n_tok,)
        self.ids = np.concatenate((self.ids, ids))
        self.counts = np.concatenate((self.counts, counts))
        self.first = np.concatenate((self.first, starts + at))  # record position of each token's first base
        self.non_acgt = np.concatenate((self.non_acgt, other_cs[ends] - other_cs[starts]))
        self.gc = np.concatenate((self.gc, gc_cs[ends] - gc_cs[starts]))
        self.soft = np.concatenate((self.soft, (2 * lows >= counts) & (counts > 0)))
        self.oov = np.concatenate((self.oov, oov))
        self.bases = np.concatenate((self.bases, raw))

    def window(self, chrom: str, g: int, length: int) -> TokenWindow:
        """The window of stream tokens [g, g + length)."""
        s = slice(g - self.t0, g - self.t0 + length)
        start = int(self.first[s.start])
        end = int(self.first[s.stop - 1] + self.counts[s.stop - 1])
        return TokenWindow(
            chrom, start, end, self.ids[s], self.counts[s], self.soft[s], self.bases[start - self.lb0 : end - self.lb0],
            int(self.non_acgt[s].sum()), int(self.gc[s].sum()), int(self.oov[s].sum()),
        )

    def trim(self, g: int) -> None:
        """Forget tokens before stream index `g` and the bases before the first kept token."""
        drop = min(max(g - self.t0, 0), self.ids.size)
        first_base = int(self.first[drop]) if drop < self.ids.size else self.lb0 + self.bases.size
        for name in ("ids", "counts", "first", "non_acgt", "gc", "soft", "oov"):
            setattr(self, name, getattr(self, name)[drop:].copy())
        self.bases = self.bases[first_base - self.lb0 :].copy()
        self.t0, self.lb0 = self.t0 + drop, first_base


def read_bases(fasta: FastaFile, chrom: str, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
    """Bases [lo, hi) of `chrom` as stored (case kept, line breaks dropped) in `out[: hi - lo]`."""
    try:
        got = encode_pieces(fasta.line_pieces(chrom, lo, hi), fasta.line_bytes(chrom)[0], out, IDENTITY)
    except ValueError as e:
        raise LcftError(f"{fasta.path}: {chrom}:{lo}-{hi}: {reason(e)} (changed since indexing?)") from None
    if got != hi - lo:
        raise LcftError(f"{fasta.path}: {chrom}:{lo}-{hi} gave {got} bases, expected {hi - lo}")
    return out[:got]


def _cut(raw: np.ndarray, at: int, tok: SeqTokenizer, final: bool) -> tuple[np.ndarray, np.ndarray]:
    """Piece boundaries of the part of `raw` to tokenize now; the rest (an unfinished run, cut at a multiple of
    `tok.carry` from its start so k-mer frames do not move) is carried into the next read."""
    bounds = tok.pieces(raw, at)
    if final or tok.carry <= 1 or bounds.size < 2:
        return bounds, raw[:0]
    last = int(bounds[-2])
    keep = last + (raw.size - last) // tok.carry * tok.carry
    bounds = bounds[:-1] if keep == last else np.concatenate((bounds[:-1], [keep]))
    return bounds, raw[int(bounds[-1]) :].copy()


def iter_token_windows(
    fasta: FastaFile, chrom: str, tok: SeqTokenizer, length: int, stride: int, chunk: int = DEFAULT_CHUNK,
) -> Iterator[tuple[TokenWindow, int]]:
    """Every full window of `length` tokens of `chrom` (one every `stride` tokens), with the number of the
    record's bases read so far. Memory is O(chunk + window span) whatever the record length."""
    n = fasta.length(chrom)
    if tok.block:
        chunk = max(chunk // tok.block, 1) * tok.block  # reads end on block cuts: no piece spans two reads
    buf = np.empty(chunk + max(tok.carry, 1), dtype=np.uint8)  # reused read buffer (+ room for a carried run)
    stream = _Tokens(tok.unk_id)
    carry = np.zeros(0, np.uint8)
    g = 0  # stream index of the next window's first token
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        buf[: carry.size] = carry
        raw = buf[: carry.size + hi - lo]  # (carry + read,) a view of the reused buffer
        read_bases(fasta, chrom, lo, hi, buf[carry.size :])
        at = lo - carry.size  # record position of raw[0]
        bounds, carry = _cut(raw, at, tok, hi == n)
        used = raw[: int(bounds[-1])]
        ids, counts = tok.encode_chunk(UPPER[used], bounds)
        stream.append(used, at, ids, counts)
        while stream.end >= g + length:
            yield stream.window(chrom, g, length), hi
            g += stride
        stream.trim(g)
