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


def strip_export(data: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer.json as it was before `hf_tokenizer_json` added upper-casing and the run split (unchanged when
    it has neither), so a model's exported tokenizer and the data's compare equal by content."""
    norm, pre, upper = data.get("normalizer") or {}, data.get("pre_tokenizer") or {}, upper_rules()
    if norm.get("type") == "Sequence" and norm["normalizers"][: len(upper)] == upper:
        rest = norm["normalizers"][len(upper) :]
        data["normalizer"] = rest[0] if len(rest) == 1 else ({"type": "Sequence", "normalizers": rest} if rest else None)
    if pre.get("type") == "Sequence" and pre["pretokenizers"][:1] == [RUNS_SPLIT]:
        rest = pre["pretokenizers"][1:]
        data["pre_tokenizer"] = rest[0] if len(rest) == 1 else ({"type": "Sequence", "pretokenizers": rest} if rest else None)
    return data


def content_sha256(json_text: str) -> str:
    """sha256 of what decides a tokenizer.json's ids (normalizer, pre-tokenizer, model, added tokens), with lcft's
    export additions removed and keys sorted: equal for the data's copy and a model exported from it."""
    data = strip_export(json.loads(json_text))
    keep = {k: data.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()
