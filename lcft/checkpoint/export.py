"""A checkpoint's model as an HF folder (`lcft export`): from a plain checkpoint's model in memory, or streamed
from DCP shards one safetensors shard at a time; and the bytes such an export writes (its disk-full message)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lcft.checkpoint.dcp import DCP_DIR, PARAM_GROUPS, check_sharded_readable, model_metadata, read_tensors
from lcft.checkpoint.hf_folder import save_pretrained, write_model_folder
from lcft.checkpoint.layout import read_model_config
from lcft.checkpoint.reader import Loaded
from lcft.files import refuse_nonempty_output
from lcft.model.hf import MAX_SHARD_BYTES, shards


def export_model(source: Loaded, out: str | os.PathLike, *, dtype: torch.dtype | None = None, force: bool = False,
                 max_shard_size: int = MAX_SHARD_BYTES) -> Path:
    """Write the model of `source` (lcft.checkpoint.load(path, materialize=False)) to `out` as an HF folder,
    keeping the tokenizer spec it records, with the tokenizer files (tokenizer.json + config: AutoTokenizer
    encodes DNA to the model's ids; lcft.genomics.hf_tokenizer.checkpoint_tokenizer). A sharded source is streamed (peak memory: about one output shard
    plus the largest tensor; the whole model is never in memory)."""
    out = Path(out)
    refuse_nonempty_output(out, force)
    if source.model is None:
        raise ValueError("export_model needs the source's model: load(path, materialize=False)")
    from lcft.genomics.hf_tokenizer import checkpoint_tokenizer

    tokenizer = checkpoint_tokenizer(source.path)
    if not source.sharded:
        return save_pretrained(source.model, out, dtype=dtype, tokenizer=source.tokenizer, hf_tokenizer=tokenizer)
    check_sharded_readable(source.path)
    model = source.model  # on the meta device: names, shapes and the shard plan; no storage
    stored = next(iter(model_metadata(source.path).values())).properties.dtype
    files = shards(model, dtype or stored, max_shard_size, read=lambda names: read_tensors(source.path, names))
    return write_model_folder(out, model.config, files, dtype or stored, source.tokenizer, hf_tokenizer=tokenizer)


def export_bytes(source: Path, dtype: object) -> int:
    """About the bytes an export of checkpoint folder `source` writes: its weights (safetensors or dcp/ shards),
    scaled to --dtype."""
    size = sum(f.stat().st_size for f in source.glob("model*.safetensors"))
    dcp_files = [f for f in (source / DCP_DIR).glob("*") if f.is_file() and f.name != PARAM_GROUPS]
    size = size or sum(f.stat().st_size for f in dcp_files) // 3  # weights + 2 moments
    config = read_model_config(source)  # transformers 5 (and lcft) write "dtype", earlier ones "torch_dtype"
    stored = getattr(torch, str(config.get("dtype") or config.get("torch_dtype") or "float32"), torch.float32)
    if isinstance(dtype, torch.dtype) and isinstance(stored, torch.dtype):
        size = size * dtype.itemsize // stored.itemsize
    return size
