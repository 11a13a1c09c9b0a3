"""The tokenizer files an exported model carries, so `transformers.AutoTokenizer` encodes DNA to lcft's ids.

`tokenizer.json` (a `tokenizers` pipeline), `tokenizer_config.json` and `special_tokens_map.json`. The pipeline
upper-cases letters first (lcft tokenizes upper case); `char` also maps the IUPAC ambiguity codes to N, and a
tokenizer.json gets lcft's run split (A/C/G/T runs apart from other letters) as its first pre-tokenizer (or, where
it has a normalizer or letter added tokens, each run's edge marked before that normalizer and split at), then,
where its pipeline puts a word-start mark before the string only, that mark before every run (lcft encodes each
run on its own); the form written is one that encodes probe sequences to prepare's ids, else the tokenizer is
refused (`prepare_tokenizer`, before any data is cut). lcft also cuts a tokenizer.json's input at every 4096 bases of the record; the
exported one sees a string as one record, so strings of up to 4096 bases encode identically, longer ones nearly so.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from lcft.errors import LcftError, shown
from lcft.files import atomic_write, present
from lcft.genomics import tokenizer as char_vocab
from lcft.genomics.library_calls import dna_probes, encoding_difference
from lcft.genomics.model_tokenizer import VOCAB_FILE, char_tokenizer, load_tokenizer
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE, SeqTokenizer, is_char
from lcft.genomics.tokenizer_hash import (
    BOUNDARY_RULE,
    BOUNDARY_SPLIT,
    MARKED_RUNS_SPLIT,
    RUNS_SPLIT,
    WORD_MARK,
    char_normalizer,
    letters_normalized,
    marks_first,
    piece_mark,
    prepends_mark,
    strip_export,
    upper_rules,
)
from lcft.vocab import kmer_spec


def _char_json() -> dict[str, Any]:
    vocab = {t: i for i, t in enumerate(char_vocab.VOCAB)}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(char_vocab.SPECIALS)],
        "normalizer": char_normalizer(),
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?m:.)"}, "behavior": "Isolated", "invert": False},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def _export_json(data: dict[str, Any], edges: bool, source: str) -> str:
    """The export of tokenizer.json `data` (lcft's additions stripped): upper-casing first, then the run split, or
    with `edges` the run edges marked before the file's normalizer (BOUNDARY_RULE) and split at."""
    data = copy.deepcopy(data)
    norm, pre = data.get("normalizer"), data.get("pre_tokenizer")
    data["normalizer"] = {"type": "Sequence",
                          "normalizers": upper_rules() + ([BOUNDARY_RULE] if edges else []) + ([norm] if norm else [])}
    if data.get("model", {}).get("type") != "WordLevel":  # k-mers read across runs (N inside K-mers)
        # lcft encodes each piece on its own, so a mark put only before a string's start goes before every piece
        mark = prepends_mark(norm) or marks_first(pre)
        if len(mark) > 1:
            raise LcftError(f"tokenizer {source}: its word-start mark {mark!r} is more than one character, which "
                            "the export cannot put before every run of bases as lcft encodes them")
        runs = MARKED_RUNS_SPLIT if prepends_mark(norm) == WORD_MARK else RUNS_SPLIT
        head = [BOUNDARY_SPLIT if edges else runs] + ([piece_mark(mark)] if mark else [])
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": head + ([pre] if pre else [])}
    data["truncation"] = data["padding"] = None
    return json.dumps(data)


def hf_tokenizer_json(tok: SeqTokenizer) -> str:
    """tokenizer.json text encoding a DNA string (any case) to the ids lcft trains on: with the run split, or where
    the file has a normalizer or letter added tokens, first with the run edges marked; the first that encodes the
    probes (`dna_probes`) to prepare's ids. Neither: a one-line error naming a probe."""
    if not tok.json_text:
        return json.dumps(_char_json())
    data = strip_export(json.loads(tok.json_text))  # a checkpoint's copy is an export already
    source = getattr(tok, "source", tok.name)
    tried = [True, False] if letters_normalized(data) or data.get("normalizer") is not None else [False]
    probes, why = dna_probes(data), ""
    for edges in tried:
        text = _export_json(data, edges, source)
        if not (why := encoding_difference(tok, text, probes) or ""):
            return text
    raise LcftError(f"tokenizer {source}: lcft cannot write a tokenizer.json with which transformers encodes DNA as "
                    f"prepare does: {why}")


def prepare_tokenizer(spec: str) -> SeqTokenizer:
    """The tokenizer prepare cuts with (`load_tokenizer`), refused in one line where its export could not encode
    DNA to the ids it gives (the data would train a model lcft cannot export)."""
    tok = load_tokenizer(spec)
    hf_tokenizer_json(tok)
    return tok


def save_hf_tokenizer(tok: SeqTokenizer, out_dir: str | Path) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`; the special-token
    roles are the tokenizer's own (read from the published files, or lcft's vocabularies' fixed ones)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = dict(tok.roles)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30,
              "clean_up_tokenization_spaces": False, **specials}
    files = {TOKENIZER_FILE: hf_tokenizer_json(tok), "tokenizer_config.json": json.dumps(config, indent=1),
             "special_tokens_map.json": json.dumps(specials, indent=1)}
    return [atomic_write(out / name, text) for name, text in files.items()]


def folder_tokenizer_spec(folder: str | Path) -> dict[str, Any] | None:
    """The spec of the tokenizer in a model folder (a published model, or an lcft export): its tokenizer.json, else
    its k-mer vocab.txt; None without either."""
    folder = Path(folder)
    found = present(folder / TOKENIZER_FILE) or present(folder / VOCAB_FILE)
    return load_tokenizer(str(folder)).spec() if found else None


def same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two specs give the same ids: equal content hashes when both have one, else equal specs."""
    if "sha256" in a and "sha256" in b:
        return a["sha256"] == b["sha256"]
    return a == b


def describe(spec: dict[str, Any]) -> str:
    """A tokenizer spec in a few words, for error messages naming both sides."""
    sha = f", sha256 {spec['sha256'][:12]}" if spec.get("sha256") else ""
    return f"{spec.get('name', '?')} with {spec.get('vocab_size', '?')} tokens{sha}"


def _field(key: str, value: Any) -> str:
    if value is None:
        return "none"
    return value[:12] if key.endswith("sha256") and isinstance(value, str) else shown(value, 40, quoted=True)


def spec_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What tells two tokenizer specs apart, in a few words: the first of their name, size, first differing token
    (specs that list their vocabulary), content hash, or any other field that differs."""
    for key in ("name", "vocab_size"):
        if a.get(key) != b.get(key):
            return f"{key} {_field(key, a.get(key))} vs {_field(key, b.get(key))}"
    va, vb = a.get("vocab"), b.get("vocab")
    if isinstance(va, list) and isinstance(vb, list) and va != vb:
        i = next((i for i, (x, y) in enumerate(zip(va, vb, strict=False)) if x != y), min(len(va), len(vb)))
        at = [_field("", v[i] if i < len(v) else None) for v in (va, vb)]
        return f"token {i} {at[0]} vs {at[1]}"
    for key in sorted({*a, *b}, key=lambda k: (k != "sha256", str(k))):
        if a.get(key) != b.get(key):
            return f"{key} {_field(str(key), a.get(key))} vs {_field(str(key), b.get(key))}"
    return "no field differs"


def rebuilt(spec: dict[str, Any]) -> SeqTokenizer | None:
    """lcft's own vocabulary that `spec` records (char; kmer:K, the built-in one), rebuilt; None for any other."""
    if same_tokenizer(spec, char_vocab.tokenizer_spec()):
        return char_tokenizer()
    try:
        kmer = kmer_spec(spec.get("name", ""))
    except LcftError:  # a name lcft does not write: not one of its own
        return None
    if kmer and not kmer[1] and "sha256" in spec:
        tok = load_tokenizer(f"kmer:{kmer[0]}")
        return tok if tok.sha256() == spec["sha256"] else None
    return None


def _mismatch(tok: SeqTokenizer, spec: dict[str, Any]) -> str | None:
    """How the tokenizer `tok` (a checkpoint's tokenizer.json) gives other ids than `spec` (its lcft.json's
    record); None when it gives the same: equal specs (by content hash where the record has one; lcft's char
    vocabulary, read back from its export, by its fixed spec), else for a record without a hash the tokens it
    lists, in order, within its size."""
    if is_char(tok) or "sha256" in spec:
        return None if same_tokenizer(tok.spec(), spec) else spec_difference(tok.spec(), spec)
    listed = spec.get("vocab", tok.vocab)
    if tok.vocab != listed or tok.vocab_size > spec["vocab_size"]:
        return spec_difference({"vocab": tok.vocab, "vocab_size": tok.vocab_size},
                               {"vocab": listed, "vocab_size": spec["vocab_size"]})
    return None


def checkpoint_tokenizer(source: str | Path, spec: dict[str, Any] | None = None,
                         vocab_size: int | None = None) -> SeqTokenizer:
    """The tokenizer of the model in `source` (a checkpoint) whose lcft.json records `spec` and whose config.json
    `vocab_size` (None: a folder that records none, as transformers writes them). With a spec: its tokenizer.json
    (checkpoints of model tokenizers carry it) when that gives the spec's ids, else the vocabulary rebuilt from
    the spec (lcft's own: char, kmer:K); without: its tokenizer.json, else lcft's char vocabulary. A
    tokenizer.json of other ids, a spec that cannot be rebuilt without one, or more tokens than the model's
    embedding has rows: a one-line error."""
    src = Path(source) / TOKENIZER_FILE
    found = load_tokenizer(str(src)) if present(src) else None  # (one that is no file: refused, not char)
    tok = found or char_tokenizer()
    if spec is not None:
        own = rebuilt(spec)
        if found is not None and (why := _mismatch(found, spec)):
            raise LcftError(f"{src} gives other ids than the tokenizer the model was trained with, which lcft.json "
                            f"records ({describe(found.spec())} vs {describe(spec)}: {why}); copy that tokenizer's files "
                            "into the checkpoint (for lcft's char and kmer:K vocabularies, removing the "
                            "tokenizer.json is enough)")
        if found is None and own is None:
            raise LcftError(f"{source} has no {TOKENIZER_FILE}, and the tokenizer its lcft.json records "
                            f"({describe(spec)}) is not one lcft can rebuild; copy the files of the tokenizer the "
                            "model was trained with (its tokenizer.json) into the checkpoint")
        # lcft's char vocabulary rebuilt even beside a tokenizer.json listing its tokens (a kmer:1 one, which maps
        # no ambiguity code to N)
        tok = own if own is not None and (found is None or is_char(own)) else found
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise LcftError(f"the tokenizer of {source} ({describe(tok.spec())}) has more tokens than the model's "
                        f"embedding has rows (config.json vocab_size {vocab_size})")
    return tok


def export_tokenizer(source: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the tokenizer files of the model in `source` (a checkpoint) into `out_dir` (checkpoint_tokenizer)."""
    return save_hf_tokenizer(checkpoint_tokenizer(source), out_dir)
