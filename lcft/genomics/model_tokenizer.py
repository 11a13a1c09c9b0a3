"""The model's own tokenizer for prepare: `char` (lcft's bases), `kmer:K[:VOCAB]` and any `tokenizers` tokenizer.json.

Every tokenizer sees a record as a sequence of *pieces* (see `split_pieces`) and encodes each piece on its own,
returning token ids and the number of bases each token covers, so every token maps back to its bases.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lcft.errors import LcftError
from lcft.genomics import tokenizer as char_vocab
from lcft.genomics.tokenizer_hash import content_sha256

BPE_BLOCK = 4096  # tokenizer.json pieces never cross a multiple of this many bases of the record (see README)
MAX_K = 12
UNK_NAMES = ("<unk>", "<oov>", "[UNK]", "<UNK>", "<OOV>", "[OOV]")
KMER_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
TOKENIZER_FILE = "tokenizer.json"  # the copy kept with prepared windows (and exported with a model)

_ACGT = np.zeros(256, dtype=bool)
_ACGT[[ord(c) for c in "ACGTacgt"]] = True
_DIGIT = np.zeros(256, dtype=np.int64)  # A C G T -> 0 1 2 3 (either case)
for _i, _c in enumerate("ACGT"):
    _DIGIT[ord(_c)] = _DIGIT[ord(_c.lower())] = _i
UPPER = np.arange(256, dtype=np.uint8)
UPPER[ord("a") : ord("z") + 1] -= 32


def acgt_mask(raw: np.ndarray) -> np.ndarray:
    """(n,) bool: the byte is A/C/G/T in either case."""
    return _ACGT[raw]


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding every id: uint8 for char (today's files), uint16/uint32 otherwise."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dt).max + 1:
            return np.dtype(dt)
    raise LcftError(f"vocabulary of {vocab_size} tokens does not fit uint32 ids")


def split_pieces(acgt: np.ndarray, start: int, block: int) -> np.ndarray:
    """Piece boundaries (offsets into the chunk, first 0, last n) of a chunk of bases beginning at record
    position `start`: a piece is a maximal run of A/C/G/T bases or of other letters, and never crosses a
    record position that is a multiple of `block` (0 = no such cut)."""
    n = acgt.size
    cuts = [np.flatnonzero(acgt[1:] != acgt[:-1]) + 1]  # where a run of one kind ends
    if block:
        first = -(-start // block) * block - start
        cuts.append(np.arange(first if first else block, n, block))  # (offset 0 is a boundary already)
    inner = np.unique(np.concatenate(cuts)) if n else np.zeros(0, np.int64)
    return np.concatenate(([0], inner, [n])).astype(np.int64)


def token_bases_of(name: str) -> str:
    """The bases a vocabulary entry spells, upper case ('' for specials and anything not made of letters):
    word-boundary marks of SentencePiece and byte-level BPE ('▁', 'Ġ', '##') are dropped."""
    s = name.replace("\u2581", "").replace("\u0120", "")
    s = s[2:] if s.startswith("##") else s
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
        """What a manifest records: equal specs = same ids for the same bases."""
        data = self.json_text.encode()
        return {"name": self.name, "vocab_size": self.vocab_size, "sha256": self.sha256(), "file": TOKENIZER_FILE,
                "file_sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "ids_dtype": self.dtype.name,
                "block": self.block, "unk_id": self.unk_id, "case_free": True}

    def bases(self) -> list[str]:
        """Per id, the bases the token spells ('' for specials and the unknown token)."""
        if len(self._bases) != len(self.vocab):
            self._bases = ["" if i in self.specials or i == self.unk_id else token_bases_of(t)
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


class KmerTokenizer(SeqTokenizer):
    """Non-overlapping K-mers from the start of each piece; the last < K bases of a piece are single-base
    tokens. A K-mer or letter missing from the vocabulary becomes the unknown token."""

    def __init__(self, k: int, vocab: list[str], source: str):
        index = {t: i for i, t in enumerate(vocab)}
        unk = next((index[u] for u in UNK_NAMES if u in index), None)
        specials = frozenset(i for i, t in enumerate(vocab) if not token_bases_of(t))
        super().__init__(f"kmer:{k}", list(vocab), unk, 0, k, "", specials)
        self.k, self.index = k, index
        missing = [b for b in "ACGT" if not any(b in token_bases_of(t) for t in vocab)]
        if missing:
            raise LcftError(f"{source} has no token for base {', '.join(missing)}")
        fill = -1 if unk is None else unk
        self._kmer = np.full(4**k, fill, dtype=np.int64)  # base-4 code of an A/C/G/T K-mer -> id
        for t, i in index.items():
            if len(t) == k and set(t) <= set("ACGT"):
                self._kmer[int("".join(str("ACGT".index(c)) for c in t), 4)] = i
        self._single = np.full(256, fill, dtype=np.int64)  # letter -> id of the single-letter token
        for t, i in index.items():
            if len(t) == 1:
                self._single[ord(t)] = i
        self.json_text = self._to_json()

    def _to_json(self) -> str:
        """The same rule as a `tokenizers` WordLevel model behind a regex pre-tokenizer (what export writes)."""
        k = self.k
        pattern = f"[ACGT]{{{k}}}|[^ACGT]{{{k}}}|(?m:.)" if k > 1 else "(?m:.)"
        return json.dumps({
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(self.vocab)},
                      "unk_token": self.vocab[self.unk_id] if self.unk_id is not None else "<unk>"},
        }, sort_keys=False)

    def encode_chunk(self, upper: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = self.k
        fill = -1 if self.unk_id is None else self.unk_id
        ids: list[Any] = []
        counts: list[np.ndarray] = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            seg = upper[a:b]  # (len,) one piece
            m = (b - a) // k  # whole K-mers of the piece
            if k == 1:
                m = 0
            elif _ACGT[seg[0]]:
                digits = _DIGIT[seg[: m * k]].reshape(m, k)  # (m, K)
                code = np.zeros(m, dtype=np.int64)  # (m,) base-4 value of each K-mer
                for j in range(k):
                    code = (code << 2) | digits[:, j]
                ids.append(self._kmer[code])
            else:  # other letters (N runs): a dictionary look-up per K-mer
                raw = seg[: m * k].tobytes().decode("latin-1")
                ids.append(np.array([self.index.get(raw[i : i + k], fill) for i in range(0, m * k, k)], np.int64))
            counts.append(np.full(m, k, dtype=np.int64))
            ids.append(self._single[seg[m * k :]])  # the tail: single-letter tokens
            counts.append(np.ones(b - a - m * k, dtype=np.int64))
        out = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if (out < 0).any():
            bad = sorted(set(chr(c) for c in np.unique(upper)) - set(self.vocab))
            raise LcftError(f"{self.name}: no token for {', '.join(bad) or 'some K-mers'} and no unknown token "
                            "in the vocabulary")
        return out, (np.concatenate(counts) if counts else np.zeros(0, np.int64))


class JsonTokenizer(SeqTokenizer):
    """A `tokenizers` tokenizer.json (BPE, WordPiece, Unigram, ...): each piece is encoded on its own
    (encode_batch, no special tokens, no truncation); bases per token come from the token offsets."""

    def __init__(self, tk: Any, source: str):
        tk.no_truncation()
        tk.no_padding()
        vocab_map = tk.get_vocab(with_added_tokens=True)
        size = max(vocab_map.values()) + 1
        vocab = [""] * size
        for t, i in vocab_map.items():
            vocab[i] = t
        model = json.loads(tk.to_str()).get("model", {})
        unk_name = model.get("unk_token")
        unk = vocab_map.get(unk_name) if unk_name else None
        specials = frozenset(i for i, t in tk.get_added_tokens_decoder().items() if t.special)
        kind = str(model.get("type", "json")).lower()
        super().__init__(kind, vocab, unk, BPE_BLOCK, 1, tk.to_str(), specials)
        self.tk, self.source = tk, source
        self.plain = json.loads(self.json_text).get("normalizer") is None
        missing = [b for b in "ACGT" if self._spells(b) != b]
        if missing:
            raise LcftError(f"tokenizer {source} has no token for base {', '.join(missing)}")

    def _spells(self, bases: str) -> str:
        enc = self.tk.encode(bases, add_special_tokens=False)
        table = self.bases()
        return "".join(table[i] for i in enc.ids) if self.unk_id not in enc.ids else ""

    def encode_chunk(self, upper: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        text = upper.tobytes().decode("latin-1")
        pieces = [text[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
        encs = self.tk.encode_batch(pieces, add_special_tokens=False)
        lens = np.array([len(e.ids) for e in encs], dtype=np.int64)  # (pieces,)
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), dtype=np.int64, count=int(lens.sum()))
        # fast path: the tokens spell their piece exactly, so bases per token = length of its spelling (reading
        # the offsets costs more than the encoding); otherwise (unknown tokens, normalizers) the offsets decide
        # (without a normalizer a token's spelling is its text, so matching totals per piece suffice)
        counts = self.spelling()[2][ids]  # (n_tok,)
        if (lens > 0).all() and np.array_equal(np.add.reduceat(counts, np.cumsum(lens) - lens), np.diff(bounds)):
            if self.plain or np.array_equal(self.spell(ids, counts), upper):
                return ids, counts
        spans = np.array([o for e in encs for o in e.offsets], dtype=np.int64).reshape(-1, 2)  # (n_tok, 2) in piece
        spans += np.repeat(bounds[:-1], lens)[:, None]  # (n_tok, 2) in the chunk
        # a token's bases run from the previous token's end to its own end (tokens of zero bases, such as a
        # lone word-boundary mark, get 0); a base no token covers means the tokenizer dropped it
        ends = np.maximum.accumulate(spans[:, 1]) if ids.size else np.zeros(0, np.int64)  # (n_tok,)
        prev = np.concatenate(([0], ends[:-1])).astype(np.int64)  # (n_tok,)
        last = np.cumsum(lens) - 1
        if not ((lens > 0).all() and (spans[:, 0] <= prev).all() and np.array_equal(ends[last], bounds[1:])):
            self._dropped(upper, spans)
        return ids, ends - prev

    def _dropped(self, upper: np.ndarray, spans: np.ndarray) -> None:
        depth = np.zeros(upper.size + 1, np.int64)  # (n+1,) +1 where a token starts, -1 where it ends
        np.add.at(depth, spans[:, 0], 1)
        np.add.at(depth, spans[:, 1], -1)
        bare = np.cumsum(depth)[:-1] <= 0  # (n,) no token covers this base
        letters = sorted({chr(c) for c in np.unique(upper[bare])})
        raise LcftError(f"tokenizer {self.source} drops letter {', '.join(letters) or '?'} (no token for it and no "
                        "unknown token), so some bases would have no token")


def char_tokenizer() -> SeqTokenizer:
    """lcft's own vocabulary (one token per base); prepare keeps its dedicated fast path."""
    return SeqTokenizer("dna-char", list(char_vocab.VOCAB) + ["?"] * (char_vocab.VOCAB_SIZE - len(char_vocab.VOCAB)),
                        char_vocab.UNK, specials=frozenset(range(4)))


def load_tokenizer(spec: str) -> SeqTokenizer:
    """`char`, `kmer:K` (built-in vocabulary), `kmer:K:PATH` (ids from a vocab.txt, a folder holding one, or a
    WordLevel tokenizer.json), or a path to a tokenizer.json / a model folder holding one. Offline only."""
    spec = (spec or "char").strip()
    if spec == "char":
        return char_tokenizer()
    if spec.startswith("kmer:"):
        k_text, _, path = spec[5:].partition(":")
        if not k_text.isdigit() or not 1 <= int(k_text) <= MAX_K:
            raise LcftError(f"tokenizer {spec}: K must be a whole number from 1 to {MAX_K}")
        k = int(k_text)
        return KmerTokenizer(k, read_vocab(Path(path)) if path else builtin_kmer_vocab(k), path or spec)
    return tokenizer_from_json_text(_read_json_tokenizer(Path(spec)).to_str(), spec)


def builtin_kmer_vocab(k: int) -> list[str]:
    """Specials, the single letters A C G T N, N*K, then every A/C/G/T K-mer in lexicographic order."""
    if k == 1:
        return [*KMER_SPECIALS, *"ACGTN"]
    return [*KMER_SPECIALS, *"ACGTN", "N" * k, *("".join(p) for p in itertools.product("ACGT", repeat=k))]


def read_vocab(path: Path) -> list[str]:
    """Token per id from a vocab.txt (one token a line), a folder holding one, or a tokenizer.json's vocab."""
    if path.is_dir():
        path = path / "vocab.txt" if (path / "vocab.txt").is_file() else path / TOKENIZER_FILE
    if not path.is_file():
        raise LcftError(f"tokenizer vocabulary {path}: no such file")
    if path.suffix == ".json":
        vocab = _json_object(path).get("model", {}).get("vocab")
        if not isinstance(vocab, dict):
            raise LcftError(f"{path}: no WordLevel vocabulary (model.vocab) in this tokenizer.json")
        out = [""] * (max(vocab.values()) + 1)
        for t, i in vocab.items():
            out[i] = t
        return out
    try:
        return [line.rstrip("\r\n") for line in path.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise LcftError(f"tokenizer vocabulary {path}: cannot read it ({e})") from None


def _json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise LcftError(f"{path} is not a tokenizer.json (not text)") from None
    except json.JSONDecodeError as e:
        raise LcftError(f"{path} is not a tokenizer.json (not JSON: {e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise LcftError(f"tokenizer {path}: cannot read it ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise LcftError(f"{path} is not a tokenizer.json (JSON but not an object)")
    return data


def _read_json_tokenizer(path: Path) -> Any:
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise LcftError(f"tokenizer folder {path} holds no {TOKENIZER_FILE} (a k-mer vocab.txt is given as "
                            f"kmer:K:{path})")
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise LcftError(f"tokenizer {path}: no such file or folder (give char, kmer:K, or a tokenizer.json)")
    _json_object(path)
    from tokenizers import Tokenizer  # lazy: only model tokenizers need the library

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with serde's message
        raise LcftError(f"{path} is not a tokenizers tokenizer.json ({str(e).splitlines()[0][:200]})") from None


def tokenizer_from_json_text(text: str, source: str) -> SeqTokenizer:
    """The tokenizer kept with prepared data (or a model) from its tokenizer.json text."""
    data = json.loads(text)
    model = data.get("model", {})
    pre = data.get("pre_tokenizer") or {}
    pattern = (pre.get("pattern") or {}).get("Regex", "") if pre.get("type") == "Split" else ""
    if model.get("type") == "WordLevel" and pattern.endswith("(?m:.)"):
        k = int(pattern[len("[ACGT]{"):].split("}")[0]) if pattern.startswith("[ACGT]{") else 1
        vocab = [""] * (max(model["vocab"].values()) + 1)
        for t, i in model["vocab"].items():
            vocab[i] = t
        return KmerTokenizer(k, vocab, source)
    from tokenizers import Tokenizer

    return JsonTokenizer(Tokenizer.from_str(text), source)
