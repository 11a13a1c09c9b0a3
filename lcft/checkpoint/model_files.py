"""The files a read of a model folder's model opens, told without torch: its config, lcft.json, tokenizer files,
generation_config.json (read as bytes, which checkpoints and exports carry as published) and weight files
(safetensors or pytorch_model.bin, lcft.model.weight_files; a sharded checkpoint's dcp/ shards), and the dtype they
store, so that a check before any work (`lcft export` into a folder holding an export) knows a source by what is
read of it."""

from __future__ import annotations

import os
from pathlib import Path

from lcft.checkpoint.layout import MODEL_CONFIG, MODEL_META, read_meta_file
from lcft.files import MAX_MODEL_JSON_BYTES, json_of, present, read_text
from lcft.genomics.seq_tokenizer import TOKENIZER_FILE
from lcft.genomics.vocab_file import ROLE_FILES
from lcft.model.weight_files import stored_dtype, weight_files, weight_sources

DCP_DIR = "dcp"
METADATA = ".metadata"  # in dcp/: DCP's index of every tensor's shards (lcft.checkpoint.dcp_metadata reads it)
PARAM_GROUPS = "param_groups.json"  # in dcp/: the optimizer's param groups, as JSON
SHARDED_META = {"weights": DCP_DIR}  # lcft.json of a sharded checkpoint says so
GENERATION_CONFIG = "generation_config.json"  # a published model's generation defaults (bos/eos/pad ids, sampling)


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """True for a checkpoint folder written through DCP: its lcft.json says "weights": "dcp" (a `dcp/.metadata`
    alone does not make one) and `dcp/.metadata` is present."""
    meta = Path(path) / MODEL_META
    if not present(meta) or not (Path(path) / DCP_DIR / METADATA).is_file():
        return False
    return read_meta_file(Path(path)).get("weights") == DCP_DIR


def sharded_weight_files(ckpt: Path) -> list[Path]:
    """The files of a sharded checkpoint's dcp/ that hold or index its tensors (the optimizer's param groups
    aside)."""
    return sorted(p for p in (ckpt / DCP_DIR).iterdir() if p.is_file() and p.name != PARAM_GROUPS)


def model_files(folder: Path) -> list[Path]:
    """Every file reading the model of `folder` opens (lcft.checkpoint.reader.load, then the tokenizer an export
    carries, lcft.genomics.hf_tokenizer.checkpoint_tokenizer): config.json, lcft.json, generation_config.json,
    tokenizer.json with the files naming its special tokens' roles, and the weights (`weight_sources`, or a
    sharded checkpoint's dcp/ files). Others beside them (a README, pytorch_model.bin beside safetensors, shards no
    index names) are not. No weights: a one-line error."""
    names = [MODEL_CONFIG, MODEL_META, GENERATION_CONFIG]
    if present(folder / TOKENIZER_FILE):
        names += [TOKENIZER_FILE, *ROLE_FILES]
    weights = sharded_weight_files(folder) if is_sharded_checkpoint(folder) else weight_sources(folder)
    return [folder / n for n in names if present(folder / n)] + weights


def read_generation_config(folder: Path) -> bytes | None:
    """The bytes of the generation_config.json of the model folder `folder` as stored, which its checkpoints and
    exports carry unchanged (the model's authors' bos/eos/pad ids and sampling defaults, which transformers reads
    from it); None where it has none. A small file of the model folder (MAX_MODEL_JSON_BYTES, bounded before it is
    read) that must be a JSON object: else a one-line error naming it."""
    path = folder / GENERATION_CONFIG
    if not present(path):  # (one that is no file: refused, not taken for none)
        return None
    text = read_text(path, MAX_MODEL_JSON_BYTES)
    json_of(text, path)
    return text.encode()  # UTF-8 decoded and encoded again: the same bytes


def weights_dtype(folder: Path) -> str | None:
    """The dtype the weights of the model folder `folder` are saved in as stored, as their safetensors headers say
    (their one dtype, or the one holding all of several: lcft.model.weight_files.stored_dtype); None where that is
    not told without torch (a sharded checkpoint's dtype is in its DCP metadata, a pytorch_model.bin's in its
    pickle)."""
    return None if is_sharded_checkpoint(folder) else stored_dtype(weight_files(folder))
