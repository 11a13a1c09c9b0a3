"""Tokenizer files as published, read with every declared count bounded: vocab.txt (both layouts), the ids of a
tokenizer.json, and the special-token roles of special_tokens_map.json / tokenizer_config.json."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from lcft import files
from lcft.errors import LcftError, shown
from lcft.files import MAX_MODEL_JSON_BYTES, parse_json, present
from lcft.vocab import MAX_VOCAB

MAX_FILE_BYTES = 256 << 20  # a vocab.txt / tokenizer.json larger than this is not a DNA tokenizer
ROLES = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token", "sep_token", "cls_token")
ROLE_FILES = ("special_tokens_map.json", "tokenizer_config.json")  # the first naming a role decides it
SPARSE_FROM = 1 << 16  # ids up to here may leave gaps (reserved ranges); above, at most half the ids unused
# Entries a tokenizer.json's post_processor may declare, counted together through a Sequence's processors (each
# processor, special token, id and token of one, template piece): published ones declare a dozen or two
# (METAGENE-1's: 5 special tokens, 5 template pieces; BERT's: 2 and 8), and each costs lcft and `tokenizers` far
# more than a vocabulary entry does (100,000 of them: seconds and hundreds of MB in prepare).
MAX_PROCESSOR_ENTRIES = 1024
_PAIR = re.compile(r"^(\S+)[ \t]+(\d+)$")  # one `TOKEN ID` line (GENERator's current layout)


def read_text(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """A tokenizer file's text: a regular file of at most `limit` bytes (lcft.files.read_text); ROLE_FILES are
    small (lcft.files.MAX_MODEL_JSON_BYTES)."""
    return files.read_text(path, limit, what)


def check_id(value: Any, where: str) -> int:
    """One declared token id: a whole number in [0, MAX_VOCAB)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_VOCAB:
        raise LcftError(f"{where}: id {value!r} is not a whole number from 0 to {MAX_VOCAB - 1} (the id limit)")
    return value


def distinct_ids(ids: dict[str, int], where: str) -> dict[int, str]:
    """Token per id of a token -> id map whose ids are bounded (check_id) and distinct."""
    seen: dict[int, str] = {}
    for token, i in ids.items():
        check_id(i, f"{where} token {token!r}")
        if i in seen:
            raise LcftError(f"{where}: id {i} is given to both {seen[i]!r} and {token!r}")
        seen[i] = token
    return seen


def vocab_size_of(ids: Collection[int], where: str) -> int:
    """The vocabulary a model gets from a tokenizer's distinct, bounded ids (the highest + 1), for every kind of
    tokenizer file. Refused in one line when there is no id, or when above SPARSE_FROM over half of the ids up to
    the highest are unused (the embedding and the head get a row for each)."""
    if not ids:
        raise LcftError(f"{where}: the vocabulary has no tokens")
    size = max(ids) + 1
    if size > SPARSE_FROM and size > 2 * len(ids):
        raise LcftError(f"{where}: its ids run to {size - 1:,} for {len(ids):,} tokens; lcft gives the model a "
                        "vocabulary up to the highest id and refuses one over half empty")
    return size


def tokens_by_id(ids: dict[str, int], where: str) -> list[str]:
    """Token per id from a token -> id map whose ids are bounded, distinct and not sparse (gaps read as '')."""
    seen = distinct_ids(ids, where)
    out = [""] * vocab_size_of(seen.keys(), where)
    for i, token in seen.items():
        out[i] = token
    return out


def check_json_ids(data: dict[str, Any], source: str) -> int:
    """Bound every id a tokenizer.json declares (model.vocab, added_tokens, its post_processor's special tokens)
    before `tokenizers` or lcft builds a table from them: an id of 10^9 in a 388-byte file must not allocate
    gigabytes. Returns the vocabulary size (vocab_size_of: refused when empty or sparse)."""
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids: Collection[int]
    if isinstance(vocab, dict):
        ids = distinct_ids(vocab, f"{source}: model.vocab").keys()
    elif isinstance(vocab, list):
        if len(vocab) > MAX_VOCAB:
            raise LcftError(f"{source}: model.vocab has {len(vocab)} entries, over the limit of {MAX_VOCAB}")
        ids = range(len(vocab))  # a Unigram's: the position is the id
    else:  # every model of the library (BPE, WordPiece, WordLevel: an object; Unigram: a list) has one
        raise LcftError(f"{source} is not a tokenizers tokenizer.json (its model has no vocab)")
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise LcftError(f"{source}: added_tokens is not a list")
    more = {check_id(tok.get("id") if isinstance(tok, dict) else tok, f"{source}: added_tokens[{j}]")
            for j, tok in enumerate(added)}
    if any(i not in ids for i in more):
        ids = {*ids, *more}
    size = vocab_size_of(ids, source)
    declared = _processor_entries(data.get("post_processor"))
    if declared > MAX_PROCESSOR_ENTRIES:
        raise LcftError(f"{source}: post_processor declares {declared:,} entries (processors, special tokens, their "
                        f"ids and tokens, template pieces), over the limit of {MAX_PROCESSOR_ENTRIES:,}")
    for name, i in _processor_ids(data.get("post_processor")):
        if check_id(i, f"{source}: post_processor special token {name!r}") >= size:
            raise LcftError(f"{source}: post_processor special token {name!r} has id {i}, beyond the vocabulary "
                            f"(ids 0 to {size - 1}): an export would emit an id the model has no row for")
    return size


def _processor_entries(node: Any) -> int:
    """How many entries a post_processor declares (MAX_PROCESSOR_ENTRIES), counted without building anything."""
    if not isinstance(node, dict):
        return 0
    subs = node.get("processors")
    count = sum(1 + _processor_entries(sub) for sub in subs) if isinstance(subs, list) else 0
    specials = node.get("special_tokens")
    for tok in specials.values() if isinstance(specials, dict) else ():
        lists = (tok.get("ids"), tok.get("tokens")) if isinstance(tok, dict) else ()
        count += 1 + sum(len(v) for v in lists if isinstance(v, list))
    return count + sum(len(node[k]) for k in ("single", "pair") if isinstance(node.get(k), list))


def _processor_ids(node: Any) -> list[tuple[str, Any]]:
    """(token, id) of each special token a post_processor adds: a TemplateProcessing's special_tokens, a
    Bert/RobertaProcessing's sep and cls, through a Sequence's processors. Shapes the library refuses are left to
    it."""
    if not isinstance(node, dict):
        return []
    subs = node.get("processors")
    found = [pair for sub in subs for pair in _processor_ids(sub)] if isinstance(subs, list) else []
    specials = node.get("special_tokens")
    for name, tok in specials.items() if isinstance(specials, dict) else ():
        ids = tok.get("ids") if isinstance(tok, dict) else None
        found.extend((str(name), i) for i in (ids if isinstance(ids, list) else ()))
    for role in ("sep", "cls"):
        pair = node.get(role)
        if isinstance(pair, list) and len(pair) == 2:
            found.append((str(pair[0]), pair[1]))
    return found


def read_vocab_txt(path: Path) -> list[str]:
    """Token per id of a vocab.txt: one token a line (the line number is the id, DNABERT) or one `TOKEN ID` pair
    a line (GENERator); the first line decides the layout. Duplicate tokens or ids, a line of the other layout,
    an empty line or an id past the limit are refused naming the line."""
    text = read_text(path, "tokenizer vocabulary")
    if text.startswith("\ufeff"):  # transformers would read it as part of line 1's token, which no role then names
        raise LcftError(f"tokenizer vocabulary {path} starts with a UTF-8 byte-order mark: save it without one")
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise LcftError(f"tokenizer vocabulary {path} is empty")
    pairs = _PAIR.match(lines[0]) is not None
    ids: dict[str, int] = {}
    token_line: dict[str, int] = {}
    id_line: dict[int, int] = {}
    for n, line in enumerate(lines, 1):
        m = _PAIR.match(line)
        if not line.strip():
            raise LcftError(f"tokenizer vocabulary {path}: line {n} is empty")
        if (m is not None) != pairs:
            layout = "`TOKEN ID` pairs" if pairs else "one token a line"
            raise LcftError(f"tokenizer vocabulary {path}: line {n} ({line[:40]!r}) does not follow the layout of "
                            f"line 1 ({layout}): mixed layouts")
        token, i = (m.group(1), check_id(int(m.group(2)), f"{path} line {n}")) if m else (line, n - 1)
        if token in token_line:
            raise LcftError(f"tokenizer vocabulary {path}: line {n} repeats token {token!r} of line {token_line[token]}")
        if i in id_line:
            raise LcftError(f"tokenizer vocabulary {path}: line {n} repeats id {i} of line {id_line[i]}")
        ids[token], token_line[token], id_line[i] = i, n, n
    return tokens_by_id(ids, str(path))


def _role_value(value: Any, path: Path, role: str) -> str | None:
    """A role's token: a string, or an AddedToken-like object with `content`; None where the file leaves the role
    null. Anything else is one line naming the file and the role (transformers refuses such a file, and lcft
    passing over it lost the role from the manifest and the export)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise LcftError(f"{path}: {role} is {shown(value, quoted=True)}, not a token (a string, or an object whose "
                    "\"content\" is one)")


def read_roles(folder: Path, vocab: list[str]) -> dict[str, str]:
    """Special-token roles (bos, eos, pad, unk, mask, sep, cls) as the folder's special_tokens_map.json and
    tokenizer_config.json give them ({} without either); a role naming a token the vocabulary lacks is refused
    (an exported tokenizer would add it under a new id)."""
    roles: dict[str, str] = {}
    names = set(vocab)
    for name in ROLE_FILES:
        path = folder / name
        if not present(path):  # (one that is no file: refused, its roles not dropped)
            continue
        data = parse_json(read_text(path, "tokenizer file", MAX_MODEL_JSON_BYTES), str(path))
        if not isinstance(data, dict):
            raise LcftError(f"{path} is not a JSON object")
        for role in ROLES:
            if role in roles:  # decided by the earlier file: transformers reads this one's value not at all
                continue
            token = _role_value(data.get(role), path, role)
            if token is None:
                continue
            if token not in names:
                raise LcftError(f"{path}: {role} {token!r} is not a token of the vocabulary")
            roles[role] = token
    return roles
