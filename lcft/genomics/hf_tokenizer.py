"""The tokenizer files an exported model carries, so `transformers.AutoTokenizer` encodes DNA to lcft's ids.

`tokenizer.json` (a `tokenizers` pipeline), `tokenizer_config.json` and `special_tokens_map.json`. The pipeline
upper-cases letters first (lcft tokenizes upper case); `char` also maps the IUPAC ambiguity codes to N, and a
tokenizer.json gets lcft's run split (A/C/G/T runs apart from other letters) as its first pre-tokenizer. lcft
also cuts a tokenizer.json's input at every 4096 bases of the record; the exported one sees a string as one
record, so strings of up to 4096 bases encode identically, longer ones nearly so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lcft.files import atomic_write
from lcft.genomics import tokenizer as char_vocab
from lcft.genomics.model_tokenizer import VOCAB_FILE, char_tokenizer, load_tokenizer
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE, SeqTokenizer
from lcft.genomics.tokenizer_hash import RUNS_SPLIT, replace_rule, upper_rules


def _char_json() -> dict[str, Any]:
    vocab = {t: i for i, t in enumerate(char_vocab.VOCAB)}
    ambiguous = [replace_rule(c, "N") for c in char_vocab.IUPAC_AMBIGUOUS]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(char_vocab.SPECIALS)],
        "normalizer": {"type": "Sequence", "normalizers": upper_rules() + ambiguous},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?m:.)"}, "behavior": "Isolated", "invert": False},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def hf_tokenizer_json(tok: SeqTokenizer) -> str:
    """tokenizer.json text encoding a DNA string (any case) to the ids lcft trains on."""
    if not tok.json_text:
        return json.dumps(_char_json())
    data = json.loads(tok.json_text)
    norms = upper_rules() + ([data["normalizer"]] if data.get("normalizer") else [])
    data["normalizer"] = {"type": "Sequence", "normalizers": norms}
    if data.get("model", {}).get("type") != "WordLevel":  # k-mers read across runs (N inside K-mers)
        pre = data.get("pre_tokenizer")
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [RUNS_SPLIT] + ([pre] if pre else [])}
    data["truncation"] = data["padding"] = None
    return json.dumps(data)


def save_hf_tokenizer(tok: SeqTokenizer, out_dir: str | Path) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`; the special-token
    roles are the tokenizer's own (read from the published files, or lcft's vocabularies' fixed ones)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = dict(tok.roles)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30,
              "clean_up_tokenization_spaces": False, **specials}
    files = {"tokenizer.json": hf_tokenizer_json(tok), "tokenizer_config.json": json.dumps(config, indent=1),
             "special_tokens_map.json": json.dumps(specials, indent=1)}
    return [atomic_write(out / name, text) for name, text in files.items()]


def folder_tokenizer_spec(folder: str | Path) -> dict[str, Any] | None:
    """The spec of the tokenizer in a model folder (a published model, or an lcft export): its tokenizer.json, else
    its k-mer vocab.txt; None without either."""
    folder = Path(folder)
    found = (folder / TOKENIZER_FILE).is_file() or (folder / VOCAB_FILE).is_file()
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


def checkpoint_tokenizer(source: str | Path) -> SeqTokenizer:
    """The tokenizer of the model in `source` (a checkpoint): its own tokenizer.json when it has one
    (checkpoints of model tokenizers carry it), else lcft's char vocabulary."""
    src = Path(source) / TOKENIZER_FILE
    return load_tokenizer(str(src)) if src.is_file() else char_tokenizer()


def export_tokenizer(source: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the tokenizer files of the model in `source` (a checkpoint) into `out_dir` (checkpoint_tokenizer)."""
    return save_hf_tokenizer(checkpoint_tokenizer(source), out_dir)
