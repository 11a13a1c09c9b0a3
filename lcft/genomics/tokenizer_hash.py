"""Content hash of a tokenizer.json: the parts that decide its ids, with the additions lcft's export makes removed."""

from __future__ import annotations

import hashlib
import json
import string
from typing import Any


def replace_rule(src: str, dst: str) -> dict[str, Any]:
    """A `tokenizers` Replace normalizer of one literal string."""
    return {"type": "Replace", "pattern": {"String": src}, "content": dst}


def upper_rules() -> list[dict[str, Any]]:
    """Upper-casing as `tokenizers` normalizers (it has no upper-case normalizer): one Replace per letter."""
    return [replace_rule(c, c.upper()) for c in string.ascii_lowercase]


RUNS_SPLIT = {"type": "Split", "pattern": {"Regex": "(?i)[ACGT]+|[^ACGT]+"}, "behavior": "Isolated", "invert": False}
WORD_MARK = "\u2581"  # SentencePiece's word-start mark
# For a pipeline that marks only a string's start (a Prepend normalizer, Metaspace's prepend_scheme "first"),
# where lcft marks each piece's: the run split keeping a normalizer's leading mark with the run after it, and
# the mark then put before every piece that lacks one.
MARKED_RUNS_SPLIT = {**RUNS_SPLIT, "pattern": {"Regex": f"(?i){WORD_MARK}?[ACGT]+|[^ACGT]+"}}
PIECE_MARK = {"type": "Metaspace", "replacement": WORD_MARK, "prepend_scheme": "always", "split": False}


def prepends_mark(normalizer: Any) -> bool:
    """The normalizer puts the word-start mark before the string (a Prepend, alone or in a Sequence)."""
    norms = (normalizer or {}).get("normalizers", [normalizer]) if isinstance(normalizer, dict) else []
    return any(isinstance(n, dict) and n.get("type") == "Prepend" and n.get("prepend") == WORD_MARK for n in norms)


def marks_first(pre: Any) -> bool:
    """The pre-tokenizer starts with a Metaspace marking only the string's first split (prepend_scheme first)."""
    first = (pre.get("pretokenizers") or [None])[0] if isinstance(pre, dict) and pre.get("type") == "Sequence" else pre
    return isinstance(first, dict) and first.get("type") == "Metaspace" and first.get("prepend_scheme") == "first" \
        and first.get("replacement") == WORD_MARK


def strip_export(data: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer.json as it was before `hf_tokenizer_json` added upper-casing and the run split (with the piece
    mark after it; unchanged when it has neither), so a model's exported tokenizer and the data's compare equal by
    content."""
    norm, pre, upper = data.get("normalizer") or {}, data.get("pre_tokenizer") or {}, upper_rules()
    if norm.get("type") == "Sequence" and norm["normalizers"][: len(upper)] == upper:
        rest = norm["normalizers"][len(upper) :]
        data["normalizer"] = rest[0] if len(rest) == 1 else ({"type": "Sequence", "normalizers": rest} if rest else None)
    split = pre["pretokenizers"][:1] if pre.get("type") == "Sequence" else []
    if split in ([RUNS_SPLIT], [MARKED_RUNS_SPLIT]):
        rest = pre["pretokenizers"][1:]
        if rest[:1] == [PIECE_MARK] and (split == [MARKED_RUNS_SPLIT] or marks_first((rest[1:] or [None])[0])):
            rest = rest[1:]
        data["pre_tokenizer"] = rest[0] if len(rest) == 1 else ({"type": "Sequence", "pretokenizers": rest} if rest else None)
    return data


def content_sha256(json_text: str) -> str:
    """sha256 of what decides a tokenizer.json's ids (normalizer, pre-tokenizer, model, added tokens), with lcft's
    export additions removed and keys sorted: equal for the data's copy and a model exported from it."""
    data = strip_export(json.loads(json_text))
    keep = {k: data.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()
