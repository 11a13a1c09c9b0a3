"""How many characters a tokenizer.json's normalizer may write for one base, read from the file alone.

Each kind of `tokenizers` normalizer has a worst case: a Replace or Prepend writes its text, a SentencePiece
`Precompiled` charsmap its longest rewrite, a Unicode form or case mapping a fixed number of code points for one
(UNICODE_GROWTH); a Sequence multiplies them, each step reading what the one before wrote. lcft hands a tokenizer
ASCII only (a FASTA whose bases are not is refused), and its export adds at most one run-edge mark a base before the
file's normalizer: on those the Unicode kinds write each character as itself, so their worst case counts only once
a rule before them may have written another.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any

from lcft.errors import LcftError
from lcft.genomics.tokenizer_hash import BOUNDARY, strip_normalizer

# Code points a normalizer of each kind writes for one it reads: (on plain text, on any). Plain: ASCII and the
# export's run-edge mark, which every kind but ByteLevel writes as itself. On any text, Unicode's normalization forms
# write 3 (NFC), 4 (NFD), 18 (NFKC, NFKD: U+FDFA); a lower-cased character 3 (Rust's char::to_lowercase);
# BertNormalizer spaces a CJK character (3), decomposes to strip accents (4) and lower-cases (3); ByteLevel writes a
# character a UTF-8 byte (4; the mark is 3). Sequence, Replace, Prepend and Precompiled are bounded from their content.
UNICODE_GROWTH = {"NFC": (1, 3), "NFD": (1, 4), "NFKC": (1, 18), "NFKD": (1, 18), "Lowercase": (1, 3),
                  "BertNormalizer": (1, 36), "ByteLevel": (3, 4), "Strip": (1, 1), "StripAccents": (1, 1), "Nmt": (1, 1)}
PLAIN_KEPT = frozenset(UNICODE_GROWTH) - {"ByteLevel"}  # kinds that write plain text as plain text
CONTENT_KINDS = ("Sequence", "Replace", "Prepend", "Precompiled")
RULE_LIMIT = 64  # characters a base a normalizer may write as its file declares it, whatever the bases
MAX_CHARSMAP = 4 << 20  # base64 characters of a Precompiled charsmap read (SentencePiece's nmt_nfkc: 316,720)
ASSERTIONS = re.compile(r"\\[bBAzZGK]|\(\?<?[=!]|[\^$]")  # zero-width: whether they match depends on context


def is_plain(text: str) -> bool:
    """`text` holds only characters every Unicode kind but ByteLevel writes as themselves (ASCII, the run-edge mark)."""
    return text.replace(BOUNDARY, "").isascii()


def normalizer_growth(node: Any, source: str, plain: bool = True) -> tuple[float, bool]:
    """(at most how many characters normalizer `node` writes for one base it reads, a piece being as short as one
    base; whether what it writes is still plain), reading plain text (`plain`, `is_plain`) or any. An object of a
    kind the library does not read counts 1 (the library refuses the file), as does one without a type, which the
    library may read by its fields: the pipeline as the library writes it back, every kind named, is checked again."""
    if isinstance(node, list):  # a Sequence's steps, each reading what the one before wrote
        growth = 1.0
        for step in node:
            g, plain = normalizer_growth(step, source, plain)
            growth *= g
        return growth, plain
    kind = node.get("type") if isinstance(node, dict) else None
    if kind == "Sequence":
        return normalizer_growth(node.get("normalizers"), source, plain)
    if kind in UNICODE_GROWTH:
        return float(UNICODE_GROWTH[kind][0 if plain else 1]), plain and kind in PLAIN_KEPT
    if kind == "Replace" and isinstance(node.get("content"), str):
        return _replace_growth(node.get("pattern"), len(node["content"])), plain and is_plain(node["content"])
    if kind == "Prepend" and isinstance(node.get("prepend"), str):
        return 1.0 + len(node["prepend"]), plain and is_plain(node["prepend"])
    if kind == "Precompiled":
        longest, plain_map = charsmap_longest(node.get("precompiled_charsmap"), source)
        return float(max(1, longest)), plain and plain_map
    return 1.0, plain


def _replace_growth(pattern: Any, content: int) -> float:
    """Characters a Replace writing `content` characters a match writes for one base it reads."""
    pattern = pattern if isinstance(pattern, dict) else {}
    text = pattern.get("String")
    if isinstance(text, str) and text:  # a String replaces len(text) characters at a time
        return max(1.0, content / len(text))
    # a regex that matches only characters replaces at least one each time; one that may match nothing, before
    # every character and after the last: n + (n + 1) * content characters for n, at most 1 + 2 * content a base
    return max(1.0, content) if _consumes(pattern.get("Regex")) else 1.0 + 2.0 * content


def _consumes(regex: Any) -> bool:
    """Whether every match of `regex` is at least one character: it has no zero-width assertion (so its empty
    match, if any, would match anywhere) and does not match the empty string. Unsure (Python's `re` does not
    compile it): False."""
    if not isinstance(regex, str) or ASSERTIONS.search(regex):
        return False
    try:
        return re.fullmatch(regex, "") is None
    except (re.error, RecursionError, OverflowError):
        return False


def charsmap_longest(charsmap: Any, source: str) -> tuple[int, bool]:
    """(code points of the longest rewrite in a Precompiled `precompiled_charsmap`; whether all are plain). The
    charsmap is base64 of: the trie's size in bytes (u32, little-endian), the trie (u32 units), then the rewrites,
    each ending in NUL; the trie maps a character (a grapheme of under 6 bytes) to the start of one, which runs to
    the next NUL, so none writes more than the longest. One lcft cannot read is refused: it cannot be bounded."""
    if not isinstance(charsmap, str) or len(charsmap) > MAX_CHARSMAP:
        size = f"{len(charsmap):,} characters" if isinstance(charsmap, str) else f"a {type(charsmap).__name__}"
        raise LcftError(f"tokenizer {source}: its Precompiled normalizer's precompiled_charsmap is {size}; lcft reads "
                        f"one of base64 text up to {MAX_CHARSMAP:,} characters")
    try:
        raw = base64.b64decode(charsmap, validate=True)
        trie = 4 + struct.unpack_from("<I", raw)[0] // 4 * 4
        if trie > len(raw):
            raise ValueError(f"its trie of {trie - 4:,} bytes runs past its {len(raw):,} bytes")
        rewrites = raw[trie:].decode("utf-8").split("\0")
    except (binascii.Error, struct.error, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise LcftError(f"tokenizer {source}: its Precompiled normalizer's precompiled_charsmap is not a "
                        f"SentencePiece charsmap ({str(e)[:120]})") from None
    return max(map(len, rewrites)), all(map(is_plain, rewrites))


def check_normalizer(normalizer: Any, source: str) -> None:
    """Refuse, in one line, normalizer `normalizer` that may write more than RULE_LIMIT characters for one base.
    lcft's export additions before it are left out (upper-casing, one for one; at most one run-edge mark a base, which
    the rest reads as plain text), so a file and its export are held to the same bound."""
    growth, _ = normalizer_growth(strip_normalizer(normalizer), source)
    if growth > RULE_LIMIT:
        raise LcftError(f"tokenizer {source}: its normalizer can write {growth:,.4g} characters for one base (lcft "
                        f"allows {RULE_LIMIT}, reading its rules from the file); lcft refuses a tokenizer that enlarges DNA")
