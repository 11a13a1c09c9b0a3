"""Content hash of a tokenizer.json: the parts that decide its ids, with the additions lcft's export makes removed."""

from __future__ import annotations

import hashlib
import json
import string
from typing import Any

from lcft.genomics.tokenizer import IUPAC_AMBIGUOUS


def replace_rule(src: str, dst: str) -> dict[str, Any]:
    """A `tokenizers` Replace normalizer of one literal string."""
    return {"type": "Replace", "pattern": {"String": src}, "content": dst}


def upper_rules() -> list[dict[str, Any]]:
    """Upper-casing as `tokenizers` normalizers (it has no upper-case normalizer): one Replace per letter."""
    return [replace_rule(c, c.upper()) for c in string.ascii_lowercase]


def char_normalizer() -> dict[str, Any]:
    """The normalizer of lcft's char vocabulary as a tokenizer.json: upper-casing, then each ambiguity code as N."""
    return {"type": "Sequence", "normalizers": upper_rules() + [replace_rule(c, "N") for c in IUPAC_AMBIGUOUS]}


RUNS_SPLIT = {"type": "Split", "pattern": {"Regex": "(?i)[ACGT]+|[^ACGT]+"}, "behavior": "Isolated", "invert": False}
WORD_MARK = "\u2581"  # SentencePiece's word-start mark
# For a pipeline that marks only a string's start (a Prepend normalizer, Metaspace's prepend_scheme "first"),
# where lcft marks each piece's: the run split keeping a normalizer's leading mark with the run after it, and
# the mark then put before every piece that lacks one (where the run edges are not marked: BOUNDARY_SPLIT).
MARKED_RUNS_SPLIT = {**RUNS_SPLIT, "pattern": {"Regex": f"(?i){WORD_MARK}?[ACGT]+|[^ACGT]+"}}
# Where the file has a normalizer (which may turn one letter into another, N into A say) or letter added tokens,
# the export marks each run's edge on the upper-cased text, before that normalizer: the normalizer and the added
# tokens then see the runs apart, as prepare encodes them, and the pre-tokenizer splits at the marks (removing
# them) instead of splitting normalized text into runs. The mark is a symbol no normalizer drops (not a control).
BOUNDARY = "\u241e"
BOUNDARY_RULE = {"type": "Replace", "pattern": {"Regex": "(?<=[ACGT])(?=[^ACGT])|(?<=[^ACGT])(?=[ACGT])"},
                 "content": BOUNDARY}
BOUNDARY_SPLIT = {"type": "Split", "pattern": {"String": BOUNDARY}, "behavior": "Removed", "invert": False}


def piece_mark(mark: str) -> dict[str, Any]:
    """A Metaspace putting the word-start mark `mark` before every piece that lacks one."""
    return {"type": "Metaspace", "replacement": mark, "prepend_scheme": "always", "split": False}


def prepends_mark(normalizer: Any) -> str:
    """The mark the normalizer puts before the string (a Prepend, alone or in a Sequence), else ''."""
    norms = (normalizer or {}).get("normalizers", [normalizer]) if isinstance(normalizer, dict) else []
    return next((n["prepend"] for n in norms if isinstance(n, dict) and n.get("type") == "Prepend"
                 and isinstance(n.get("prepend"), str)), "")


def marks_first(pre: Any) -> str:
    """The mark of a Metaspace that starts the pre-tokenizer and marks only the string's first split
    (prepend_scheme first), else ''."""
    first = (pre.get("pretokenizers") or [None])[0] if isinstance(pre, dict) and pre.get("type") == "Sequence" else pre
    if isinstance(first, dict) and first.get("type") == "Metaspace" and first.get("prepend_scheme") == "first":
        return str(first.get("replacement") or "")
    return ""


def is_letters(text: Any) -> bool:
    """`text` is made of ASCII letters only (an added token DNA can hold)."""
    return isinstance(text, str) and text.isascii() and text.isalpha()


def letters_normalized(data: dict[str, Any]) -> bool:
    """Set the letter added tokens of a pipeline without a normalizer to be matched after normalizing: with no
    normalizer, before it or after is alike, and the export matches them after its upper-casing, as prepare (which
    upper-cases first) does; True when the pipeline has letter added tokens (`<pad>` is none: never in DNA)."""
    letters = [t for t in data.get("added_tokens") or [] if isinstance(t, dict) and is_letters(t.get("content"))]
    for t in letters if data.get("normalizer") is None else []:
        t["normalized"] = True
    return bool(letters)


def strip_normalizer(norm: Any) -> Any:
    """The normalizer without the export's upper-casing and run-edge marks (unchanged without them; None for none)."""
    upper = upper_rules()
    steps = norm.get("normalizers") if isinstance(norm, dict) and norm.get("type") == "Sequence" else None
    if not isinstance(steps, list) or steps[: len(upper)] != upper:
        return norm or None
    rest = steps[len(upper) :]
    rest = rest[1:] if rest[:1] == [BOUNDARY_RULE] else rest
    return rest[0] if len(rest) == 1 else ({"type": "Sequence", "normalizers": rest} if rest else None)


def strip_export(data: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer.json as it was before `hf_tokenizer_json` added upper-casing and the run split or run-edge marks
    (with the piece mark after it; unchanged when it has neither), so a model's exported tokenizer and the data's
    compare equal by content."""
    pre = data.get("pre_tokenizer") or {}
    data["normalizer"] = strip_normalizer(data.get("normalizer"))
    split = pre["pretokenizers"][:1] if pre.get("type") == "Sequence" else []
    if split in ([RUNS_SPLIT], [MARKED_RUNS_SPLIT], [BOUNDARY_SPLIT]):
        rest = pre["pretokenizers"][1:]
        mark = prepends_mark(data["normalizer"]) or marks_first((rest[1:] or [None])[0])
        if split == [MARKED_RUNS_SPLIT]:
            mark = WORD_MARK
        if mark and rest[:1] == [piece_mark(mark)]:
            rest = rest[1:]
        data["pre_tokenizer"] = rest[0] if len(rest) == 1 else ({"type": "Sequence", "pretokenizers": rest} if rest else None)
    return data


def content_sha256(json_text: str) -> str:
    """sha256 of what decides a tokenizer.json's ids (normalizer, pre-tokenizer, model, added tokens), with lcft's
    export additions removed and keys sorted: equal for the data's copy and a model exported from it."""
    data = strip_export(json.loads(json_text))
    letters_normalized(data)
    keep = {k: data.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()
