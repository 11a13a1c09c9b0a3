"""Reader of a prepared folder: one split's windows memory-mapped, with each token's bases and the window's sequence."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lcft.errors import LcftError, shell_word, shown
from lcft.genomics.shards import MANIFEST, bin_name, read_manifest, softmask_name
from lcft.genomics.tokenizer import A, C, G, T, decode

if TYPE_CHECKING:
    from lcft.genomics.seq_tokenizer import SeqTokenizer

BASES_DTYPE = np.uint16  # bases per token in {split}.bases.bin


def bases_name(split: str) -> str:
    return f"{split}.bases.bin"


def basemask_name(split: str) -> str:
    return f"{split}.basemask.bin"


class WindowSet:
    """The windows of one split, memory-mapped: ws[i] -> token ids (length ws.length, dtype ws.dtype),
    ws.softmask(i) (per token), ws.coords(i) -> (chrom, start, end), 0-based end-exclusive in the FASTA
    record's coordinates, ws.base_offsets(i) and ws.sequence(i) for every tokenizer."""

    def __init__(self, out_dir: str | os.PathLike, split: str) -> None:
        self.dir = Path(out_dir)
        self.manifest = read_manifest(self.dir)
        if split not in self.manifest["splits"]:
            raise LcftError(f"no split {split!r} in {self.dir} (have {', '.join(self.manifest['splits'])})")
        self.split = split
        self.length: int = self.manifest["length"]
        self.dtype = np.dtype(self.manifest.get("ids_dtype", "uint8"))
        self.records: list[dict] = [r for r in self.manifest["records"] if r["split"] == split]
        self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
        n = len(self.records)
        self._ids_checked = np.zeros(n, dtype=bool)  # (n,) windows whose ids were checked once (the map is read-only)
        self._ids = self._map(bin_name(split), n * self.length, self.dtype)
        self._soft = self._map(softmask_name(split), n * self.length // 8)
        self.per_base = "bases_file" in self.manifest  # model tokenizers: tokens of several bases
        if self.per_base:
            spans = np.array([r["end"] - r["start"] for r in self.records], dtype=np.int64)  # (n,)
            self._mask_at = np.concatenate(([0], np.cumsum((spans + 7) // 8)))  # (n+1,) byte offset per window
            self._bases = self._map(bases_name(split), n * self.length, np.dtype(BASES_DTYPE))
            self._basemask = self._map(basemask_name(split), int(self._mask_at[-1]))
        elif any(r["end"] - r["start"] != self.length for r in self.records):  # a char token is one base
            raise LcftError(f"{self.dir / MANIFEST}: corrupt manifest (a {split} window spans other than its "
                            f"{self.length} bases)")

    def _map(self, name: str, count: int, dtype: np.dtype = np.dtype(np.uint8)) -> np.ndarray:
        path = self.dir / name
        if not path.is_file():
            raise LcftError(f"{path} is missing (run `lcft prepare verify {shell_word(self.dir)}`)")
        size = count * dtype.itemsize
        if path.stat().st_size != size:
            raise LcftError(f"{path} has {path.stat().st_size} bytes, the manifest says {size} (corrupt)")
        if size == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    def __len__(self) -> int:
        return len(self.records)

    def _check(self, i: int) -> int:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} {self.split} windows")
        return i % len(self)

    def __getitem__(self, i: int) -> np.ndarray:
        """(L,) memmap view of window i's token ids, each checked to be in the vocabulary: a file whose sha256
        the manifest was made to match (or read unverified) must not index past the model's embedding."""
        i = self._check(i)
        ids = self._ids[i * self.length : (i + 1) * self.length]  # (L,)
        if self._ids_checked[i] or not len(ids):
            return ids
        if (top := int(ids.max())) >= self.vocab_size:
            raise LcftError(f"{self.dir / bin_name(self.split)}: window {i} holds token id {top}, outside the "
                            f"windows' vocabulary of {self.vocab_size} (damaged, or not written by lcft prepare); "
                            "prepare the windows again")
        self._ids_checked[i] = True  # a sample is a slice of its window: each read of it needs no new pass
        return ids

    def softmask(self, i: int) -> np.ndarray:
        """(L,) bool: the token is soft-masked (for tokens of several bases: at least half its bases are)."""
        i = self._check(i)
        w = self.length // 8
        return np.unpackbits(self._soft[i * w : (i + 1) * w]).view(bool)  # (L,) True = lower case

    def coords(self, i: int) -> tuple[str, int, int]:
        r = self.records[self._check(i)]
        return r["chrom"], r["start"], r["end"]

    def token_bases(self, i: int) -> np.ndarray:
        """(L,) int64: the number of bases of each token of window i."""
        i = self._check(i)
        if not self.per_base:
            return np.ones(self.length, dtype=np.int64)
        counts = np.asarray(self._bases[i * self.length : (i + 1) * self.length], dtype=np.int64)  # (L,)
        r = self.records[i]
        if int(counts.sum()) != r["end"] - r["start"]:  # position by base, bits per base read them
            raise LcftError(f"{self.dir / bases_name(self.split)}: window {i}'s tokens hold {int(counts.sum())} "
                            f"bases, its record {r['end'] - r['start']} (damaged, or not written by lcft "
                            "prepare); prepare the windows again")
        return counts

    def base_offsets(self, i: int) -> np.ndarray:
        """(L,) int64: where each token's first base lies, counted from the window's first base
        (coords(i)[1] + offset is the position in the FASTA record)."""
        counts = self.token_bases(i)  # (L,)
        return np.concatenate(([0], np.cumsum(counts[:-1]))).astype(np.int64)

    def sequence(self, i: int) -> str:
        """The window's bases, upper case, lower case where soft-masked in the FASTA. Letters the vocabulary has
        no token for (the unknown token) read back as N; with `char` so do the IUPAC ambiguity codes."""
        i = self._check(i)
        if not self.per_base:
            return decode(self[i], self.softmask(i))
        out = self.tokenizer.spell(np.asarray(self[i], dtype=np.int64), self.token_bases(i))  # (span,) upper
        r = self.records[i]
        lower = np.unpackbits(self._basemask[self._mask_at[i] : self._mask_at[i + 1]])[: r["end"] - r["start"]]
        out = np.where(lower.astype(bool), out | 0x20, out)  # ASCII lower-case bit
        return out.astype(np.uint8).tobytes().decode("ascii")

    @functools.cached_property
    def tokenizer(self) -> SeqTokenizer:
        """The tokenizer the windows were cut with (char, or the tokenizer.json kept in the folder)."""
        from lcft.genomics.model_tokenizer import char_tokenizer, tokenizer_from_json_text

        if not self.per_base:
            return char_tokenizer()
        from lcft.genomics.vocab_file import read_text

        name = self.manifest["tokenizer"].get("file", "tokenizer.json")
        text = read_text(self.dir / name, "the windows' tokenizer")  # bounded, a regular file, UTF-8
        spec = self.manifest["tokenizer"]
        tok = tokenizer_from_json_text(text, str(self.dir / name), spec.get("roles"))
        # its tables (counted labels, spellings) are indexed by ids checked against the manifest's vocab_size
        if tok.vocab_size != self.vocab_size or tok.sha256() != spec.get("sha256"):
            raise LcftError(f"{self.dir / name} is not the tokenizer {self.dir / MANIFEST} records ({tok.vocab_size:,} "
                            f"tokens, sha256 {tok.sha256()[:12]} vs {self.vocab_size:,}, "
                            f"{shown(spec.get('sha256'))[:12]}); prepare the windows again")
        return tok

    @functools.cached_property
    def counted(self) -> np.ndarray:
        """(vocab,) bool: labels that carry loss (tokens made only of A/C/G/T; N, unknown and specials never)."""
        if not self.per_base:
            out = np.zeros(256, dtype=bool)
            out[[A, C, G, T]] = True
            return out
        return self.tokenizer.counted()

    def __repr__(self) -> str:
        return f"WindowSet({str(self.dir)!r}, {self.split!r}: {len(self)} windows of {self.length})"


def open_windows(out_dir: str | os.PathLike, split: str) -> WindowSet:
    """The windows of `split` ('train' or 'eval') in a folder written by `prepare_windows`."""
    return WindowSet(out_dir, split)
