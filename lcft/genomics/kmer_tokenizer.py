"""`kmer:K[:VOCAB]`: non-overlapping K-mers read left to right from the record's first base (GENERator's rule).

N and other letters sit inside K-mers like any base (a K-mer the vocabulary lacks is its unknown token), so a
window's ids equal those of the published k-mer tokenizers; only the record's last < K bases differ by vocabulary:
one token spelling them (GENERator: its unknown token) unless every base has a single-letter token (lcft's own
vocabulary), then one token per base.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import numpy as np

from lcft.errors import LcftError
from lcft.genomics.seq_tokenizer import DIGIT, SeqTokenizer, acgt_mask, token_bases_of

UNK_NAMES = ("<unk>", "<oov>", "[UNK]", "<UNK>", "<OOV>", "[OOV]")  # a bare vocab.txt's unknown token
KMER_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
BUILTIN_ROLES = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
_PATTERN = re.compile(r"^\(\?m:\.\{(\d+)\}\)\|\(\?m:\.\+?\)$")  # what KmerTokenizer._to_json writes (K > 1)


def kmer_k_of(pattern: str) -> int | None:
    """K of a k-mer tokenizer.json's split regex as lcft writes it; None for any other regex."""
    if pattern == "(?m:.)":
        return 1
    m = _PATTERN.match(pattern)
    return int(m.group(1)) if m else None


def builtin_kmer_vocab(k: int) -> list[str]:
    """Specials, the single letters A C G T N, N*K, then every A/C/G/T K-mer in lexicographic order."""
    if k == 1:
        return [*KMER_SPECIALS, *"ACGTN"]
    return [*KMER_SPECIALS, *"ACGTN", "N" * k, *("".join(p) for p in itertools.product("ACGT", repeat=k))]


class KmerTokenizer(SeqTokenizer):
    """K-mers from the record's start, N inside them; the record's last < K bases as described above."""

    def __init__(self, k: int, vocab: list[str], source: str, roles: dict[str, str] | None = None) -> None:
        index = {t: i for i, t in enumerate(vocab) if t}
        roles = dict(roles or {})
        unk_name = roles.get("unk_token") or next((u for u in UNK_NAMES if u in index), None)
        unk = index.get(unk_name) if unk_name else None
        specials = frozenset(i for i, t in enumerate(vocab) if not token_bases_of(t))
        super().__init__(f"kmer:{k}", list(vocab), unk, 0, k, "", specials, roles, runs=False)
        self.k, self.index = k, index
        missing = [b for b in "ACGT" if not any(b in token_bases_of(t) for t in vocab)]
        if missing:
            raise LcftError(f"{source} has no token for base {', '.join(missing)}")
        fill = -1 if unk is None else unk
        self._kmer = np.full(4**k, -1, dtype=np.int64)  # base-4 code of an A/C/G/T K-mer -> id
        for t, i in index.items():
            if len(t) == k and set(t) <= set("ACGT"):
                self._kmer[int("".join(str("ACGT".index(c)) for c in t), 4)] = i
        self._check_every_kmer(source)
        self._single = np.full(256, fill, dtype=np.int64)  # letter -> id of the single-letter token
        for t, i in index.items():
            if len(t) == 1 and ord(t) < 256:  # (a letter outside Latin-1 never occurs in a FASTA read)
                self._single[ord(t)] = i
        self.tail_single = k == 1 or all(b in index for b in "ACGT")
        self.json_text = self._to_json()

    def _check_every_kmer(self, source: str) -> None:
        """Every A/C/G/T K-mer has its own token: one the vocabulary lacks (another K, a truncated or damaged
        vocab.txt, a token in lower case) would turn plain sequence into unknown tokens that carry no loss."""
        lacking = np.flatnonzero(self._kmer < 0)  # (m,) base-4 codes of the K-mers without a token
        if lacking.size:
            code, k = int(lacking[0]), self.k
            first = "".join("ACGT"[(code >> 2 * (k - 1 - j)) & 3] for j in range(k))
            more = f" and {lacking.size - 1:,} more" if lacking.size > 1 else ""
            raise LcftError(f"{source} has no token for {first}{more} of the {4**k:,} A/C/G/T {k}-mers (a "
                            f"vocabulary of another K, or a damaged one)")

    def _to_json(self) -> str:
        """The same rule as a `tokenizers` WordLevel model behind a regex pre-tokenizer (what export writes)."""
        k = self.k
        tail = "(?m:.)" if self.tail_single else "(?m:.+)"
        pattern = f"(?m:.{{{k}}})|{tail}" if k > 1 else "(?m:.)"
        return json.dumps({
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(self.vocab) if t},
                      "unk_token": self.vocab[self.unk_id] if self.unk_id is not None else "<unk>"},
        }, sort_keys=False)

    def _kmer_ids(self, seg: np.ndarray, m: int) -> np.ndarray:
        """(m,) ids of the m whole K-mers at the start of `seg`: a base-4 table look-up where a K-mer is all
        A/C/G/T, a dictionary look-up for the others (those holding N or another letter)."""
        k = self.k
        whole = seg[: m * k].reshape(m, k)  # (m, K)
        code = np.zeros(m, dtype=np.int64)  # (m,) base-4 value of each K-mer
        for j in range(k):
            code = (code << 2) | DIGIT[whole[:, j]]
        ids = self._kmer[code]  # (m,)
        fill = -1 if self.unk_id is None else self.unk_id
        all_n = (whole == ord("N")).all(axis=1)  # (m,) inside an N run: one look-up for all of them
        ids[all_n] = self.index.get("N" * k, fill)
        other = np.flatnonzero(~acgt_mask(whole).all(axis=1) & ~all_n)  # (n_other,) K-mers holding another letter
        if other.size:
            texts = whole[other].tobytes().decode("latin-1")
            ids[other] = [self.index.get(texts[j : j + k], fill) for j in range(0, other.size * k, k)]
        return ids

    def encode_chunk(self, upper: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = self.k
        fill = -1 if self.unk_id is None else self.unk_id
        ids: list[Any] = []
        counts: list[np.ndarray] = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            seg = upper[a:b]  # (len,) one piece
            m = 0 if k == 1 else (b - a) // k  # whole K-mers of the piece
            if m:
                ids.append(self._kmer_ids(seg, m))
                counts.append(np.full(m, k, dtype=np.int64))
            tail = seg[m * k :]  # (< K,) the record's last bases (k == 1: every base)
            if self.tail_single or not tail.size:
                ids.append(self._single[tail])
                counts.append(np.ones(tail.size, dtype=np.int64))
            else:
                ids.append(np.array([self.index.get(tail.tobytes().decode("latin-1"), fill)], np.int64))
                counts.append(np.array([tail.size], np.int64))
        out = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if (out < 0).any():
            bad = sorted(set(chr(c) for c in np.unique(upper)) - set(self.vocab))
            raise LcftError(f"{self.name}: no token for {', '.join(bad) or 'some K-mers'} and no unknown token "
                            "in the vocabulary")
        return out, (np.concatenate(counts) if counts else np.zeros(0, np.int64))
