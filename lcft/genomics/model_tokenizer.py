"""The model's own tokenizer for prepare: `char` (lcft's bases), `kmer:K[:VOCAB]` and any `tokenizers` tokenizer.json.

Files are read as published (`vocab_file`): every id bounded before a table is built, special-token roles from
the special_tokens_map.json / tokenizer_config.json beside the vocabulary. A folder holding only a vocab.txt is
a k-mer vocabulary (K from tokenizer_config.json's `k`, else the length of its A/C/G/T tokens).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from lcft.errors import LcftError, did_you_mean, shown
from lcft.files import MAX_MODEL_JSON_BYTES, parse_json, present
from lcft.genomics import tokenizer as char_vocab
from lcft.genomics.kmer_tokenizer import BUILTIN_ROLES, KmerTokenizer, builtin_kmer_vocab, kmer_k_of
from lcft.genomics.library_calls import dna_probes, encoding_difference, guarded
from lcft.genomics.normalizer_growth import check_normalizer
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE, WORD_MARKS, SeqTokenizer
from lcft.genomics.tokenizer_hash import char_normalizer, upper_rules
from lcft.genomics.tokenizer_probe import BPE_BLOCK, probe_tokenizer, vouch
from lcft.genomics.vocab_file import (
    MAX_FILE_BYTES,
    check_json_ids,
    read_roles,
    read_text,
    read_vocab_txt,
    tokens_by_id,
    vocab_size_of,
)
from lcft.hub import local_path, read_as_path
from lcft.vocab import MAX_K, kmer_spec

VOCAB_FILE = "vocab.txt"


def word_marks(data: dict[str, Any], source: str) -> str:
    """The word-boundary marks a tokenizer.json's pipeline writes into its tokens besides '▁' and 'Ġ': a Metaspace's
    replacement, a Prepend's text, what a Replace puts for a space. An ASCII letter is refused in one line: a token's
    bases could not be told from it."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, dict):
            kind = node.get("type")
            mark = node.get("replacement") if kind == "Metaspace" else node.get("prepend") if kind == "Prepend" else \
                node.get("content") if kind == "Replace" and node.get("pattern") == {"String": " "} else None
            found.extend([mark] if isinstance(mark, str) else [])
            for v in node.values():
                walk(v)

    walk([data.get("normalizer"), data.get("pre_tokenizer")])
    letters = [m for m in found if any(c.isascii() and c.isalpha() for c in m)]
    if letters:
        raise LcftError(f"tokenizer {source}: its word-boundary mark {letters[0]!r} holds a letter, so lcft cannot "
                        "tell which letters of a token are bases")
    return "".join(sorted(set("".join(found)) - set(WORD_MARKS)))


class JsonTokenizer(SeqTokenizer):
    """A `tokenizers` tokenizer.json (BPE, WordPiece, Unigram, ...): each piece is encoded on its own
    (encode_batch, no special tokens, no truncation); bases per token come from the token offsets."""

    def __init__(self, tk: Any, source: str, roles: dict[str, str] | None = None) -> None:
        tk.no_truncation()
        tk.no_padding()
        vocab_map = tk.get_vocab(with_added_tokens=True)
        vocab = [""] * vocab_size_of(set(vocab_map.values()), f"tokenizer {source}")  # the ids as the library reads them
        for t, i in vocab_map.items():
            vocab[i] = t
        model = json.loads(tk.to_str()).get("model", {})
        unk_name = model.get("unk_token")
        unk = vocab_map.get(unk_name) if unk_name else None
        specials = frozenset(i for i, t in tk.get_added_tokens_decoder().items() if t.special)
        kind = str(model.get("type", "json")).lower()
        super().__init__(kind, vocab, unk, BPE_BLOCK, 1, tk.to_str(), specials, dict(roles or {}))
        self.tk, self.source = tk, source
        self.affixes = (model.get("continuing_subword_prefix") or "", model.get("end_of_word_suffix") or "")
        dropout = model.get("dropout")
        if dropout is not None and 0 < dropout < 1:  # 0 and 1 give one answer: every merge, or none
            raise LcftError(f"tokenizer {source}: its BPE dropout ({dropout}) skips merges at random, so the same "
                            "bases get other ids on every call; lcft needs one answer (set model.dropout to null)")
        data = json.loads(self.json_text)
        self.plain = data.get("normalizer") is None
        self.marks = WORD_MARKS + word_marks(data, source)
        missing = [b for b in "ACGT" if self._spells(b) != b]
        self._spells("N")  # a letter without a token: one line now, where the library fails on it, not mid-prepare
        if missing:
            raise LcftError(f"tokenizer {source} has no token for base {', '.join(missing)}")

    def _spells(self, bases: str) -> str:
        enc = guarded(lambda: self.tk.encode(bases, add_special_tokens=False), self.source, repr(bases))
        table = self.bases()
        return "".join(table[i] for i in enc.ids) if self.unk_id not in enc.ids else ""

    def encode_chunk(self, upper: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        text = upper.tobytes().decode("latin-1")
        pieces = [text[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
        # not held: a chunk takes long while prepare's progress bar writes to stderr, and the file met the library
        # as it loaded (its regexes and normalizer probed in a child, its bases spelled here, held)
        encs = guarded(lambda: self.tk.encode_batch(pieces, add_special_tokens=False), self.source, hold=False)
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
        # a token sharing its start with the next one (a lone word-start mark put before a base) covers no base
        spans[:-1, 1] = np.where(spans[1:, 0] == spans[:-1, 0], spans[:-1, 0], spans[:-1, 1])
        # a token's bases run from the previous token's end to its own end (tokens of zero bases, such as a
        # lone word-boundary mark, get 0); a base no token covers means the tokenizer dropped it
        ends = np.maximum.accumulate(spans[:, 1]) if ids.size else np.zeros(0, np.int64)  # (n_tok,)
        prev = np.concatenate(([0], ends[:-1])).astype(np.int64)  # (n_tok,)
        last = np.cumsum(lens) - 1
        if not ((lens > 0).all() and (spans[:, 0] <= prev).all() and np.array_equal(ends[last], bounds[1:])):
            self._dropped(upper)
        return ids, ends - prev

    def _dropped(self, upper: np.ndarray) -> None:
        """Refuse a chunk some of whose bases no token covers, naming each letter of it that the library encodes,
        alone, to no token: the offsets cannot say which (after a dropped letter the library's offsets shift, so
        'NRN' gives two N tokens at (0, 1) and (1, 2), as if the second N were the one dropped)."""
        def dropped(letter: str) -> bool:
            return not guarded(lambda: self.tk.encode(letter, add_special_tokens=False), self.source, repr(letter)).ids

        letters = [c for c in map(chr, np.unique(upper).tolist()) if dropped(c)]
        raise LcftError(f"tokenizer {self.source} drops letter {', '.join(letters) or '?'} (no token for it and no "
                        "unknown token), so some bases would have no token")


def char_tokenizer() -> SeqTokenizer:
    """lcft's own vocabulary (one token per base); prepare keeps its dedicated fast path."""
    return SeqTokenizer(char_vocab.NAME, list(char_vocab.VOCAB) + ["?"] * (char_vocab.VOCAB_SIZE - len(char_vocab.VOCAB)),
                        char_vocab.UNK, specials=frozenset(range(4)), roles=dict(BUILTIN_ROLES))


def load_tokenizer(spec: str) -> SeqTokenizer:
    """`char`, `kmer:K` (built-in vocabulary), `kmer:K:PATH` (ids from a vocab.txt, a folder holding one, or a
    WordLevel tokenizer.json), or a path to a tokenizer.json / a model folder holding one (or only a vocab.txt) / a
    k-mer vocab.txt itself (K as for its folder); the tokenizer.json lcft exports for `char` reads as `char`.
    Special-token roles come from the files beside the vocabulary. A folder may be a Hub id ORG/NAME[@REVISION]
    (lcft.hub: read from its cache, or downloaded)."""
    spec = (spec or "char").strip()
    if spec == "char":
        return char_tokenizer()
    if kmer := kmer_spec(spec):
        k, path = kmer
        if not path:
            return KmerTokenizer(k, builtin_kmer_vocab(k), spec, BUILTIN_ROLES)
        vocab, folder = read_vocab(local_path(path, weights=False), path)
        return KmerTokenizer(k, vocab, path, read_roles(folder, vocab))
    folder = local_path(spec, weights=False)  # a Hub id ORG/NAME[@REVISION]: its cached snapshot (lcft.hub)
    if folder.is_file() and folder.name == VOCAB_FILE:  # a k-mer vocabulary named itself: read as its folder's
        folder, only_vocab = folder.parent, True
    else:
        only_vocab = folder.is_dir() and not present(folder / TOKENIZER_FILE) and present(folder / VOCAB_FILE)
    if only_vocab:
        vocab = read_vocab_txt(folder / VOCAB_FILE)
        return KmerTokenizer(_folder_k(folder, vocab), vocab, spec, read_roles(folder, vocab))
    path = _json_path(folder, spec)
    tok = tokenizer_from_json_text(_canonical(path), spec)
    tok.roles = read_roles(path.parent, tok.vocab)
    return tok


def _folder_k(folder: Path, vocab: list[str]) -> int:
    """K of a folder's k-mer vocab.txt: tokenizer_config.json's `k`, else the one length of its A/C/G/T tokens."""
    config = folder / "tokenizer_config.json"
    k = _json_object(config, MAX_MODEL_JSON_BYTES).get("k") if present(config) else None
    if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_K:
        return k
    lengths = sorted({len(t) for t in vocab if t and set(t) <= set("ACGT")})
    if len(lengths) != 1 or not 1 <= lengths[0] <= MAX_K:
        raise LcftError(f"tokenizer folder {folder}: cannot tell K of its {VOCAB_FILE} (A/C/G/T tokens of lengths "
                        f"{lengths[:6]}); give it as kmer:K:{folder}")
    return lengths[0]


def read_vocab(path: Path, given: str = "") -> tuple[list[str], Path]:
    """Token per id from a vocab.txt (vocab_file.read_vocab_txt), a folder holding one, or a tokenizer.json's
    WordLevel vocabulary; with the folder whose role files apply (`given`: `path` as the user wrote it)."""
    if path.is_dir():
        found = [path / name for name in (VOCAB_FILE, TOKENIZER_FILE) if present(path / name)]
        if not found:
            raise LcftError(f"tokenizer folder {path} holds no {VOCAB_FILE} or {TOKENIZER_FILE}")
        path = found[0]
    if not present(path, "tokenizer vocabulary"):  # (a FIFO or a device there: said what it is)
        raise LcftError(f"tokenizer vocabulary {path}: no such file{read_as_path(given)}")
    if path.suffix == ".json":
        data = _json_object(path)
        vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
        if not isinstance(vocab, dict):
            raise LcftError(f"{path}: no WordLevel vocabulary (model.vocab) in this tokenizer.json")
        return tokens_by_id(vocab, f"{path}: model.vocab"), path.parent
    return read_vocab_txt(path), path.parent


def _json_object(path: Path, limit: int = MAX_FILE_BYTES) -> dict:
    """A tokenizer file's JSON object (its size bounded by read_text: `limit` bytes)."""
    return _tokenizer_data(read_text(path, "tokenizer", limit), str(path))


def _tokenizer_data(text: str, source: str) -> dict:
    """The JSON object of a tokenizer file's text (nesting bounded by lcft.files.parse_json), else one line."""
    data = parse_json(text, f"{source} is not a tokenizer.json")
    if not isinstance(data, dict):
        raise LcftError(f"{source} is not a tokenizer.json (JSON but not an object)")
    return data


def _json_path(path: Path, given: str) -> Path:
    """The tokenizer.json `path` is or holds (`given`: `path` as the user wrote it), else one line."""
    if path.is_dir():
        if not present(path / TOKENIZER_FILE):
            raise LcftError(f"tokenizer folder {path} holds no {TOKENIZER_FILE} or {VOCAB_FILE} (a k-mer vocab.txt "
                            f"elsewhere is given as kmer:K:PATH)")
        path = path / TOKENIZER_FILE
    if not present(path, "tokenizer"):  # (a FIFO or a device there: said what it is, not "no such file")
        raise LcftError(f"tokenizer {path}: no such file or folder (give char, kmer:K, or a tokenizer.json)"
                        f"{read_as_path(given)}{_builtin_meant(str(path))}")
    return path


def _builtin_meant(text: str) -> str:
    """' (did you mean ...?)' when `text` reads as a built-in tokenizer misspelt ('Char', 'kmer6', 'KMER-6',
    '6mer'), else ''."""
    low = text.strip().lower()
    m = re.fullmatch(r"k-?mers?[:_ -]?(\d{1,3})|(\d{1,3})-?mers?", low)
    meant = "char" if low in ("char", "chars", "character", "characters") else (
        f"kmer:{int(m[1] or m[2])}" if m and 1 <= int(m[1] or m[2]) <= MAX_K else None)
    return did_you_mean(meant)


def _canonical(path: Path) -> str:
    """The tokenizer.json at `path` as `tokenizers` writes it back (what is kept with the data)."""
    data = _json_object(path)
    check_json_ids(data, str(path))
    return _parse(json.dumps(data), str(path), data).to_str()


def _parse(text: str, source: str, data: dict[str, Any]) -> Any:
    """A `tokenizers` Tokenizer from tokenizer.json text (parsed: `data`) whose ids are bounded; its regexes
    probed first (`probe_tokenizer`: it does not enlarge DNA)."""
    probe_tokenizer(data, text, source)
    from tokenizers import Tokenizer  # lazy: only model tokenizers need the library

    # a bare Exception with serde's message, or a Rust panic building the model (a BPE whose merges lack its
    # continuing_subword_prefix): one line either way
    tk = guarded(lambda: Tokenizer.from_str(text), source, refusal=f"{source} is not a tokenizers tokenizer.json")
    canonical = tk.to_str()
    # as the library read it: a normalizer written without its type (which it reads by its fields) named here
    check_normalizer(json.loads(canonical).get("normalizer"), source)
    vouch(canonical)  # the same pipeline as the library writes it back (the form kept with the data)
    return tk


def tokenizer_from_json_text(text: str, source: str, roles: dict[str, str] | None = None) -> SeqTokenizer:
    """The tokenizer kept with prepared data (or a model) from its tokenizer.json text and special-token roles."""
    data = _tokenizer_data(text, source)
    check_json_ids(data, source)
    model = data.get("model", {})
    pre = data.get("pre_tokenizer") or {}
    pattern = (pre.get("pattern") or {}).get("Regex", "") if pre.get("type") == "Split" else ""
    k = kmer_k_of(pattern) if model.get("type") == "WordLevel" else None
    if k is not None:
        vocab = tokens_by_id(model["vocab"], f"{source}: model.vocab")
        norm = data.get("normalizer")
        if k == 1 and norm == char_normalizer() and vocab == list(char_vocab.VOCAB):
            return _as_the_file_encodes(char_tokenizer(), text, data, source)  # lcft's char vocabulary, exported
        # lcft reads the K-mers of the bases themselves, never running a normalizer: one besides an export's
        # upper-casing would change the bases for `tokenizers` alone, other ids, and nothing here would bound it
        if norm not in (None, {"type": "Sequence", "normalizers": upper_rules()}):
            raise LcftError(f"tokenizer {source}: lcft's k-mer pre-tokenizer with a normalizer "
                            f"({shown(norm.get('type') if isinstance(norm, dict) else norm, 40)}): lcft reads K-mers "
                            "of the bases as they are, which would give other ids than this file; remove its normalizer")
        return _as_the_file_encodes(KmerTokenizer(k, vocab, source, roles), text, data, source)
    return JsonTokenizer(_parse(text, source, data), source, roles)


def _as_the_file_encodes(tok: SeqTokenizer, text: str, data: dict[str, Any], source: str) -> SeqTokenizer:
    """`tok`, lcft's own reading of a K-mer WordLevel tokenizer.json (`text`, parsed: `data`; K-mers, or char's
    export), where `tokenizers` gives the file's ids for the upper-case DNA prepare hands a tokenizer: that reading
    takes the vocabulary and the split alone, so the file's added tokens (matched before the split), its model's
    unknown token and its split's other fields are held to it here. Else one line naming a probe. The text lcft
    writes for `tok` itself (the copy kept with windows) is taken as it is: the library reads 4^10 K-mers in
    seconds."""
    if text == tok.json_text:
        return tok
    plain = json.dumps({**data, "truncation": None, "padding": None})  # as lcft encodes: neither
    probes = list(dict.fromkeys(p.upper() for p in dna_probes(data)))
    if why := encoding_difference(tok, plain, probes, source):
        raise LcftError(f"tokenizer {source}: the file encodes DNA otherwise than lcft reads its vocabulary and "
                        f"split ({why}): its added tokens or unknown token change the ids; remove them")
    return tok
