"""lcft's own DNA character vocabulary (ids and the spec a manifest or checkpoint records), below every layer."""

from __future__ import annotations

PAD, BOS, EOS, UNK = 0, 1, 2, 3
A, C, G, T, N = 4, 5, 6, 7, 8
BASES = "ACGTN"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
VOCAB: tuple[str, ...] = SPECIALS + tuple(BASES)
VOCAB_SIZE = 16  # padded to 16 (embedding rows beyond len(VOCAB) are never produced)


def tokenizer_spec() -> dict:
    """What a manifest or checkpoint records so a data set and a model can be checked for compatibility."""
    return {"name": "dna-char", "vocab": list(VOCAB), "vocab_size": VOCAB_SIZE, "case_free": True}
