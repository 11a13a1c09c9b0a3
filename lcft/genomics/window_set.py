"""Reader of a prepared folder: one split's windows read by position, with each token's bases and the window's sequence."""

from __future__ import annotations

import errno
import functools
import os
import weakref
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


class _Column:
    """One file of a split, opened once and read by position (os.preadv into a fresh array). A memory map of it
    would stop the process with SIGBUS, without a message, on the first read past where another process cut it."""

    def __init__(self, folder: Path, name: str, count: int, dtype: np.dtype) -> None:
        self.path, self.folder, self.dtype = folder / name, folder, dtype
        if not self.path.is_file():
            raise LcftError(f"{self.path} is missing (run `lcft prepare verify {shell_word(folder)}`)")
        self.size = count * dtype.itemsize
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, fd)  # the descriptor lives as long as the reader
        self.fd = fd
        if (have := os.fstat(fd).st_size) != self.size:  # the size of the file opened, not of a name's later file
            raise LcftError(f"{self.path} has {have} bytes, the manifest says {self.size} (corrupt)")

    def read(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) the file's items [start, stop), or a one-line error if the file no longer holds them."""
        out = np.empty(stop - start, dtype=self.dtype)
        view = memoryview(out).cast("B")
        at, done = start * self.dtype.itemsize, 0
        while done < len(view):  # a regular file reads whole but at its end; the loop also takes a short read
            try:
                n = os.preadv(self.fd, [view[done:]], at + done)
            except OSError as e:  # NFS: the file was replaced on the server (another node's prepare --overwrite)
                if e.errno != errno.ESTALE:
                    raise
                n = 0
            if n == 0:
                raise self.changed(at + len(view))
            done += n
        return out

    def changed(self, end: int) -> LcftError:
        """The error for a file that no longer holds byte `end - 1`: it was cut or replaced since it was checked."""
        try:
            now = f"{os.fstat(self.fd).st_size:,} bytes"
        except OSError:
            now = "no longer readable"
        return LcftError(f"{self.path} changed since it was checked: it had {self.size:,} bytes, now {now}, and "
                         f"a read to byte {end:,} found its end (cut short or rewritten while in use); check the "
                         f"folder with `lcft prepare verify {shell_word(self.folder)}` and prepare it again if needed")


class WindowSet:
    """The windows of one split, read from its files as asked: ws[i] -> token ids (length ws.length, dtype ws.dtype),
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
        self._ids = _Column(self.dir, bin_name(split), n * self.length, self.dtype)
        self._soft = _Column(self.dir, softmask_name(split), n * self.length // 8, np.dtype(np.uint8))
        self.per_base = "bases_file" in self.manifest  # model tokenizers: tokens of several bases
        if self.per_base:
            spans = np.array([r["end"] - r["start"] for r in self.records], dtype=np.int64)  # (n,)
            self._mask_at = np.concatenate(([0], np.cumsum((spans + 7) // 8)))  # (n+1,) byte offset per window
            self._bases = _Column(self.dir, bases_name(split), n * self.length, np.dtype(BASES_DTYPE))
            self._basemask = _Column(self.dir, basemask_name(split), int(self._mask_at[-1]), np.dtype(np.uint8))
        elif any(r["end"] - r["start"] != self.length for r in self.records):  # a char token is one base
            raise LcftError(f"{self.dir / MANIFEST}: corrupt manifest (a {split} window spans other than its "
                            f"{self.length} bases)")

    def __len__(self) -> int:
        return len(self.records)

    def _check(self, i: int) -> int:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} {self.split} windows")
        return i % len(self)

    def _span(self, start: int, stop: int | None) -> tuple[int, int]:
        stop = self.length if stop is None else stop
        if not 0 <= start <= stop <= self.length:
            raise ValueError(f"tokens [{start}, {stop}) are not inside a window of {self.length}")
        return start, stop

    def ids(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(stop - start,) token ids [start, stop) of window i (default all L), dtype ws.dtype, each checked to be
        in the vocabulary: a file whose sha256 the manifest was made to match (or read unverified, or rewritten
        since) must not index past the model's embedding."""
        i, (start, stop) = self._check(i), self._span(start, stop)
        ids = self._ids.read(i * self.length + start, i * self.length + stop)  # (stop - start,)
        if len(ids) and (top := int(ids.max())) >= self.vocab_size:
            raise LcftError(f"{self.dir / bin_name(self.split)}: window {i} holds token id {top}, outside the "
                            f"windows' vocabulary of {self.vocab_size} (damaged, or not written by lcft prepare); "
                            "prepare the windows again")
        return ids

    def __getitem__(self, i: int) -> np.ndarray:
        """(L,) window i's token ids, as `ids(i)`."""
        return self.ids(i)

    def softmask(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(stop - start,) bool for tokens [start, stop) of window i (default all L): the token is soft-masked
        (for tokens of several bases: at least half its bases are)."""
        i, (start, stop) = self._check(i), self._span(start, stop)
        at = i * self.length // 8  # L is a multiple of 8: a window's bits start on a byte
        bits = np.unpackbits(self._soft.read(at + start // 8, at + (stop + 7) // 8)).view(bool)  # True = lower case
        return bits[start % 8 : start % 8 + stop - start]

    def coords(self, i: int) -> tuple[str, int, int]:
        r = self.records[self._check(i)]
        return r["chrom"], r["start"], r["end"]

    def token_bases(self, i: int) -> np.ndarray:
        """(L,) int64: the number of bases of each token of window i."""
        i = self._check(i)
        if not self.per_base:
            return np.ones(self.length, dtype=np.int64)
        counts = self._bases.read(i * self.length, (i + 1) * self.length).astype(np.int64)  # (L,)
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
        lower = np.unpackbits(self._basemask.read(int(self._mask_at[i]), int(self._mask_at[i + 1])))[: r["end"] - r["start"]]
        out = np.where(lower.astype(bool), out | 0x20, out)  # ASCII lower-case bit
        return out.astype(np.uint8).tobytes().decode("ascii")

    @functools.cached_property
    def tokenizer(self) -> SeqTokenizer:
        """The tokenizer the windows were cut with (char, or the tokenizer.json kept in the folder)."""
        from lcft.genomics.model_tokenizer import char_tokenizer, tokenizer_from_json_text

        if not self.per_base:
            return char_tokenizer()
        from lcft.genomics.seq_tokenizer import TOKENIZER_FILE
        from lcft.genomics.vocab_file import read_text

        name = self.manifest["tokenizer"].get("file", TOKENIZER_FILE)
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
