"""lcft's own vocabularies, below every layer: the DNA characters (ids and the spec a manifest or checkpoint
records) and the grammar of a `kmer:K[:PATH]` tokenizer spec."""

from __future__ import annotations

from lcft.errors import LcftError

NAME = "dna-char"  # the name its spec records
PAD, BOS, EOS, UNK = 0, 1, 2, 3
A, C, G, T, N = 4, 5, 6, 7, 8
BASES = "ACGTN"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
VOCAB: tuple[str, ...] = SPECIALS + tuple(BASES)
VOCAB_SIZE = 16  # padded to 16 (embedding rows beyond len(VOCAB) are never produced)


def tokenizer_spec() -> dict:
    """What a manifest or checkpoint records so a data set and a model can be checked for compatibility."""
    return {"name": NAME, "vocab": list(VOCAB), "vocab_size": VOCAB_SIZE, "case_free": True}


# ids 0..4,194,303: the one vocabulary limit, of a model (lcft.model.config.COUNT_LIMITS) and of every id a tokenizer
# file declares, so prepare refuses what train could not use; 16x the largest published model vocabulary (256K)
MAX_VOCAB = 1 << 22
MAX_K = 10  # a table of 4^K ids; the built-in vocabulary 4^K + 10 stays within MAX_VOCAB (4^11 would not)
SPEC_TEXT = ("name", "sha256", "file", "file_sha256", "ids_dtype")  # spec fields that are strings
SPEC_COUNTS = ("bytes", "block")  # and whole numbers


def spec_problem(spec: object) -> str | None:
    """What is wrong with a tokenizer spec read from a file (a manifest's, an lcft.json's), as this module's
    `tokenizer_spec` and SeqTokenizer.spec write them; None when every field has its kind. Readers then use it
    as written (its name and vocab_size, compare hashes, look up its roles)."""
    if not isinstance(spec, dict):
        return "not an object"
    size = spec.get("vocab_size")
    if type(size) is not int or not 1 <= size <= MAX_VOCAB:  # ids 0..MAX_VOCAB - 1
        return f"vocab_size is not a whole number from 1 to {MAX_VOCAB}"
    if not isinstance(spec.get("name"), str) or not all(isinstance(spec.get(k, ""), str) for k in SPEC_TEXT):
        return f"one of {', '.join(SPEC_TEXT)} is not text"
    counts = [spec[k] for k in (*SPEC_COUNTS, "unk_id") if spec.get(k) is not None]
    if not all(type(v) is int and v >= 0 for v in counts):
        return f"one of {', '.join(SPEC_COUNTS)}, unk_id is not a whole number"
    roles, vocab = spec.get("roles", {}), spec.get("vocab", [])
    if not (isinstance(roles, dict) and all(isinstance(v, str) for v in roles.values())):
        return "roles is not an object of token texts"
    if not (isinstance(vocab, list) and all(isinstance(v, str) for v in vocab)):
        return "vocab is not a list of token texts"
    if type(spec.get("case_free", True)) is not bool:
        return "case_free is not true or false"
    return None


def kmer_spec(spec: str) -> tuple[int, str] | None:
    """K and the vocabulary path (empty: the built-in one) of a `kmer:K[:PATH]` tokenizer spec; None for a spec of
    another kind. A K that is not a whole number from 1 to MAX_K is one line."""
    if not spec.startswith("kmer:"):
        return None
    k_text, _, path = spec.removeprefix("kmer:").partition(":")
    if not k_text.isdigit() or not 1 <= int(k_text) <= MAX_K:
        raise LcftError(f"tokenizer {spec}: K must be a whole number from 1 to {MAX_K}")
    return int(k_text), path
