"""Cut one chromosome into kept windows for a split writer: lcft's char vocabulary (fast path) or a model tokenizer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from lcft.errors import LcftError
from lcft.genomics.fasta import FastaFile
from lcft.genomics.seq_tokenizer import SeqTokenizer
from lcft.genomics.shards import SplitWriter
from lcft.genomics.token_windows import iter_token_windows
from lcft.genomics.tokenizer import IUPAC_AMBIGUOUS, UNK
from lcft.genomics.windows import DEFAULT_CHUNK, iter_windows

KNOWN_CHAR_LETTERS = set("ACGTN" + IUPAC_AMBIGUOUS)  # letters `char` has a token for (ambiguity codes -> N)


def _record(split: str, win: Any, oov: int) -> dict[str, Any]:
    return {"split": split, "chrom": win.chrom, "start": win.start, "end": win.end,
            "n_frac": round(win.n_frac, 6), "gc_frac": round(win.gc_frac, 6), "oov": oov}


def _unknown_letters(fasta: FastaFile, chrom: str, start: int, end: int) -> Counter:
    """Letters of bases [start, end) that `char` maps to <unk> (read again: the fast path keeps only ids)."""
    raw = fasta.read_raw(chrom, start, end).translate(None, b"\r\n").upper().decode("latin-1")
    return Counter(ch for ch in raw if ch not in KNOWN_CHAR_LETTERS)


def cut_char(
    fasta: FastaFile, chrom: str, split: str, opts: dict[str, Any], writer: SplitWriter, records: list[dict],
    letters: Counter, progress: Callable[[int], None],
) -> tuple[int, int]:
    """Windows of `char` tokens (one per base) of `chrom` into `writer`; (kept, skipped for N)."""
    length, stride, max_n = opts["length"], opts["stride"], opts["max_n_frac"]
    kept = skipped = 0
    for win, upto in iter_windows(fasta, chrom, length, stride, DEFAULT_CHUNK):
        if win.n_frac > max_n:
            skipped += 1
        else:
            ids, soft = writer.buffers(length)
            win.fill(ids, soft)
            # <unk> can only sit where a base is not A/C/G/T, so most windows skip this count
            oov = int(np.count_nonzero(ids == UNK)) if win.n_count else 0
            if oov:
                letters.update(_unknown_letters(fasta, chrom, win.start, win.end))
            writer.add(ids, soft)
            kept += 1
            records.append(_record(split, win, oov))
        progress(upto)
    return kept, skipped


def cut_tokens(
    fasta: FastaFile, chrom: str, split: str, opts: dict[str, Any], tok: SeqTokenizer, writer: SplitWriter,
    records: list[dict], letters: Counter, progress: Callable[[int], None],
) -> tuple[int, int]:
    """Windows of `length` model tokens of `chrom` into `writer` (ids, token soft mask, bases per token, base
    soft mask); (kept, skipped for N). The N filter counts bases: non-A/C/G/T bases over the window's span."""
    length, stride, max_n = opts["length"], opts["stride"], opts["max_n_frac"]
    kept = skipped = 0
    for win, upto in iter_token_windows(fasta, chrom, tok, length, stride):
        if win.n_frac > max_n:
            skipped += 1
        else:
            letters.update(win.letters_behind(tok.unk_id))  # those of kept windows, as char's
            writer.add(*win.arrays(tok.dtype))
            kept += 1
            records.append(_record(split, win, win.oov) | {"bases": win.end - win.start})
        progress(upto)
    return kept, skipped


def check_oov(split: str, oov: int, tokens: int, letters: dict[str, int], max_frac: float, name: str) -> None:
    """Refuse a split whose share of unknown tokens is above `max_frac`, naming the letters behind them (a
    model fed many unknown tokens in place of bases degenerates)."""
    if tokens and oov / tokens > max_frac:
        top = sorted(letters.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{ch!r} ({n:,} bases)" for ch, n in top[:8]) or "unknown"
        raise LcftError(
            f"{split}: {oov:,} of {tokens:,} tokens ({oov / tokens:.2%}) are the {name} tokenizer's unknown token, "
            f"above --max-oov-frac {max_frac}; letters without a token: {shown}. Use a tokenizer with tokens "
            "for them or raise --max-oov-frac"
        )
