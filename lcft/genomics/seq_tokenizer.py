"""What prepare needs of a model tokenizer (`SeqTokenizer`): pieces, token ids, the bases each token covers.

Every tokenizer sees a record as a sequence of *pieces* (see `split_pieces`) and encodes each piece on its own,
returning token ids and the number of bases each token covers, so every token maps back to its bases.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lcft.errors import LcftError
from lcft.genomics.tokenizer_hash import content_sha256
from lcft.vocab import tokenizer_spec as char_spec

TOKENIZER_FILE = "tokenizer.json"  # the copy kept with prepared windows (and exported with a model)

_ACGT = np.zeros(256, dtype=bool)
_ACGT[[ord(c) for c in "ACGTacgt"]] = True
DIGIT = np.zeros(256, dtype=np.int64)  # A C G T -> 0 1 2 3 (either case)
for _i, _c in enumerate("ACGT"):
    DIGIT[ord(_c)] = DIGIT[ord(_c.lower())] = _i
UPPER = np.arange(256, dtype=np.uint8)
UPPER[ord("a") : ord("z") + 1] -= 32


def acgt_mask(raw: np.ndarray) -> np.ndarray:
    """(n,) bool: the byte is A/C/G/T in either case."""
    return _ACGT[raw]


def prefix_counts(mask: np.ndarray) -> np.ndarray:
    """(n+1,) int32: how many of mask[:i] are set, for each i. Summed as bytes into int32: numpy's cumsum of a
    bool array casts each element on its own, 15x slower (8 against 0.5 ns an element on an AMD EPYC); a read
    is far below 2^31 bases."""
    out = np.zeros(mask.size + 1, dtype=np.int32)
    np.cumsum(mask.view(np.uint8), dtype=np.int32, out=out[1:])
    return out


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding every id: uint8 for char (today's files), uint16/uint32 otherwise."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dt).max + 1:
            return np.dtype(dt)
    raise LcftError(f"vocabulary of {vocab_size} tokens does not fit uint32 ids")


def split_pieces(acgt: np.ndarray, start: int, block: int, runs: bool = True) -> np.ndarray:
    """Piece boundaries (offsets into the chunk, first 0, last n) of a chunk of bases beginning at record
    position `start`: a piece is a maximal run of A/C/G/T bases or of other letters (with `runs`; else the
    chunk is one piece), and never crosses a record position that is a multiple of `block` (0 = no such cut)."""
    n = acgt.size
    cuts = [np.flatnonzero(acgt[1:] != acgt[:-1]) + 1 if runs else np.zeros(0, np.int64)]  # where a run ends
    if block:
        first = -(-start // block) * block - start
        cuts.append(np.arange(first if first else block, n, block))  # (offset 0 is a boundary already)
    inner = np.unique(np.concatenate(cuts)) if n else np.zeros(0, np.int64)
    return np.concatenate(([0], inner, [n])).astype(np.int64)


WORD_MARKS = "\u2581\u0120"  # the word-boundary marks of SentencePiece and byte-level BPE ('▁', 'Ġ')


def token_bases_of(name: str, affixes: tuple[str, str] = ("##", ""), marks: str = WORD_MARKS) -> str:
    """The bases a vocabulary entry spells, upper case ('' for specials and anything not made of letters):
    word-boundary `marks` are dropped (SentencePiece's and byte-level BPE's, and a pipeline's own), and the
    vocabulary's own (prefix, suffix) marking a word's inner and last pieces (WordPiece's '##', a BPE's `</w>`)."""
    s = name.translate({ord(c): None for c in marks})
    prefix, suffix = affixes
    s = s[len(prefix) :] if prefix and s.startswith(prefix) else s
    s = s[: -len(suffix)] if suffix and s.endswith(suffix) else s
    return s.upper() if s.isascii() and s.isalpha() else ""


@dataclass
class SeqTokenizer:
    """What prepare needs of a tokenizer; `encode_chunk` is implemented per kind."""

    name: str
    vocab: list[str]  # token string per id
    unk_id: int | None
    block: int = 0  # pieces never cross a multiple of this many bases (0: none)
    carry: int = 1  # a run cut at a read boundary must be cut at a multiple of this from its start
    json_text: str = ""  # canonical tokenizer.json kept with the data ('' for char)
    specials: frozenset[int] = field(default_factory=frozenset)
    roles: dict[str, str] = field(default_factory=dict)  # special-token role -> token (vocab_file.ROLES)
    runs: bool = True  # pieces end where a run of A/C/G/T meets other letters (k-mers read across: False)
    affixes: tuple[str, str] = ("##", "")  # (prefix, suffix) a token's spelling may carry (token_bases_of)
    marks: str = WORD_MARKS  # word-boundary marks a token's spelling may carry (token_bases_of)
    _bases: list[str] = field(default_factory=list, repr=False)
    _table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def dtype(self) -> np.dtype:
        return ids_dtype(self.vocab_size)

    def sha256(self) -> str:
        """Content hash of the tokenizer (hf_tokenizer.content_sha256): what data and models compare."""
        return content_sha256(self.json_text)

    def spec(self) -> dict[str, Any]:
        """What a manifest records: equal specs = same ids for the same bases (lcft's char vocabulary, which keeps
        no tokenizer.json: its fixed spec)."""
        if is_char(self):
            return char_spec()
        data = self.json_text.encode()
        return {"name": self.name, "vocab_size": self.vocab_size, "sha256": self.sha256(), "file": TOKENIZER_FILE,
                "file_sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "ids_dtype": self.dtype.name,
                "block": self.block, "unk_id": self.unk_id, "case_free": True, "roles": dict(self.roles)}

    def pieces(self, raw: np.ndarray, start: int) -> np.ndarray:
        """Piece boundaries of a chunk of bases `raw` beginning at record position `start` (see split_pieces)."""
        return split_pieces(acgt_mask(raw), start, self.block, self.runs)

    def bases(self) -> list[str]:
        """Per id, the bases the token spells ('' for specials and the unknown token)."""
        if len(self._bases) != len(self.vocab):
            self._bases = ["" if i in self.specials or i == self.unk_id else token_bases_of(t, self.affixes, self.marks)
                           for i, t in enumerate(self.vocab)]
        return self._bases

    def spelling(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The bases of every vocabulary entry as one uint8 table, each entry's offset into it, its length."""
        if self._table is None:
            bases = self.bases()
            lens = np.array([len(b) for b in bases], dtype=np.int64)  # (V,)
            offsets = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)  # (V,)
            table = np.frombuffer("".join(bases).encode("ascii") or b"N", dtype=np.uint8)
            self._table = table, offsets, lens
        return self._table

    def spell(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(sum(counts),) uint8: the bases of tokens `ids` covering `counts` bases each, upper case; N for the
        bases of a token that does not spell that many (the unknown token, specials)."""
        table, offsets, lens = self.spelling()
        starts = np.cumsum(counts) - counts  # (n_tok,) output offset of each token
        src = np.repeat(offsets[ids] - starts, counts) + np.arange(int(counts.sum()))  # (span,) table index
        spelled = np.repeat(lens[ids] == counts, counts)  # (span,)
        return np.where(spelled, table[np.where(spelled, src, 0)], np.uint8(ord("N"))).astype(np.uint8)

    def counted(self) -> np.ndarray:
        """(vocab_size,) bool: tokens made only of A/C/G/T (the ones that carry loss)."""
        return np.array([bool(b) and set(b) <= set("ACGT") for b in self.bases()], dtype=bool)

    def encode_chunk(self, upper: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (n_tok,) int64 and bases per token (n_tok,) int64 of the pieces [bounds[j], bounds[j+1])
        of `upper` (upper-case bytes)."""
        raise NotImplementedError


def is_char(tok: SeqTokenizer) -> bool:
    """lcft's own vocabulary: one token per base, written exactly as before model tokenizers existed (it keeps no
    tokenizer.json text)."""
    return not tok.json_text
