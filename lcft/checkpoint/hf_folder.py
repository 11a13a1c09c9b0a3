"""Model folders in HuggingFace's layout, the one writer and reader: config.json + model.safetensors (or shards) +
lcft.json for lcft's own attention settings and the tokenizer spec, + the tokenizer files of a model tokenizer, + a
published model's generation_config.json, carried as it is.
Folders written by transformers load too (lcft.model.hf maps config.json, lcft.model.hf_params the weights)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lcft.checkpoint.layout import (
    MODEL_CONFIG,
    MODEL_META,
    MODEL_META_VERSION,
    config_file,
    read_meta_file,
    read_model_config,
)
from lcft.checkpoint.model_files import GENERATION_CONFIG
from lcft.disk import rename_refused
from lcft.errors import LcftError, reason, shown
from lcft.files import atomic_write, expect_folder, present, replacing
from lcft.model.config import AttentionConfig, LlamaConfig
from lcft.model.hf import config_from_hf, config_to_hf
from lcft.model.hf_params import MAX_SHARD_BYTES, check_weights, load_weights, shards, stale_weight_files
from lcft.model.llama import Llama
from lcft.model.weight_files import common_dtype
from lcft.umask import respect_umask
from lcft.vocab import tokenizer_spec


def _write_folder(directory: Path, files: dict[str, Any]) -> None:
    """Write {name: bytes | tensor dict | function returning one} atomically: a fresh folder appears complete
    under its name (temp sibling + rename; a file system that will not rename a folder: one line, nothing left);
    into an existing folder its config.json goes first, then each file is written to a temp name and renamed,
    weights first and config.json last (weight files of an earlier save removed before it), so a half-written
    folder never looks loadable (an old config beside new weights did)."""
    def write(dst: Path, name: str) -> None:
        value = files[name]
        if callable(value):  # a weight shard, built only now: one shard's copy in memory at a time
            value = value()
        if isinstance(value, dict):
            save_file(value, str(dst), metadata={"format": "pt"})
        else:
            dst.write_bytes(value)

    order = sorted(files, key=lambda n: n == MODEL_CONFIG)
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
        try:
            respect_umask(tmp)  # mkdtemp makes it 0700
            for name in order:
                write(tmp / name, name)
                respect_umask(tmp / name, folder=False)  # safetensors writes 0600
            try:
                os.replace(tmp, directory)
            except OSError as e:
                if (why := rename_refused(e, directory.parent)) is None:
                    raise
                raise LcftError(f"cannot write the model folder {directory}: {why}") from None
        except BaseException:  # the error goes on; left unsaid: the temp folder is this call's own, of files it
            shutil.rmtree(tmp, ignore_errors=True)  # just wrote, so only a failing filesystem keeps it
            raise
        return
    expect_folder(directory)
    refuse_non_files(directory, set(files))
    (directory / MODEL_CONFIG).unlink(missing_ok=True)
    for name in order:
        if name == MODEL_CONFIG:
            for stale in _stale_files(directory, set(files)):
                stale.unlink()
        with replacing(directory / name) as tmp:
            write(tmp, name)


def move_model_files(src: Path, dst: Path) -> None:
    """Move the files of the complete model folder `src` into the existing folder `dst` (same filesystem: one
    rename each). `dst`'s config.json goes first and comes back last, after the other files and after the
    weight files (and generation_config.json, `_stale_files`) of an earlier save are removed, so a half-moved folder
    never looks loadable (nor mixes two models)."""
    names = sorted((p.name for p in src.iterdir()), key=lambda n: n == MODEL_CONFIG)
    refuse_non_files(dst, set(names))
    try:
        (dst / MODEL_CONFIG).unlink(missing_ok=True)
        for stale in _stale_files(dst, set(names)):
            stale.unlink()
        for name in names:
            os.replace(src / name, dst / name)
    except OSError as e:
        raise LcftError(f"cannot move the model files into {dst}: {reason(e)}") from None


def _stale_files(directory: Path, keep: set[str]) -> list[Path]:
    """The files of an earlier save in `directory` that a save of the files `keep` removes: its weight files
    (`stale_weight_files`), and its generation_config.json where this model has none (else the folder would
    give this model another's generation settings)."""
    generation = directory / GENERATION_CONFIG
    stale = [generation] if GENERATION_CONFIG not in keep and os.path.lexists(generation) else []
    return stale_weight_files(directory, keep) + stale


def refuse_non_files(directory: Path, names: set[str]) -> None:
    """Before a save into the existing `directory` replaces or removes anything: each of its files the save
    replaces (`names`) or removes (an earlier save's, `_stale_files`) must be a file or a link, never a folder (which
    a rename or unlink cannot replace: the save would stop half-done)."""
    for path in sorted({*(directory / n for n in names), *_stale_files(directory, names)}):
        if os.path.lexists(path) and not (path.is_symlink() or path.is_file()):
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise LcftError(f"{path} is {kind}, where the model folder has a file: move it out of {directory} "
                           "first (nothing was changed)")


def save_pretrained(model: Llama, directory: str | os.PathLike, dtype: torch.dtype | None = None,
                    max_shard_size: int = MAX_SHARD_BYTES, tokenizer: dict[str, Any] | None = None,
                    hf_tokenizer: Any = None, generation: bytes | None = None) -> Path:
    """Write config.json (the model's own HF class), model.safetensors (HF names; sharded with an index above
    max_shard_size bytes, as transformers does) and lcft.json; loadable by transformers' from_pretrained and by
    from_pretrained here. dtype: cast weights (None = as stored: the one dtype config.json names, the one holding
    all where the parameters are of several, lcft.model.weight_files.common_dtype). tokenizer: the data's tokenizer
    spec lcft.json records (default: lcft's char vocabulary); hf_tokenizer: a model tokenizer whose files go beside
    it; generation: the bytes of the generation_config.json it carries (None: none)."""
    stored = common_dtype(str(p.dtype).removeprefix("torch.") for p in model.parameters())
    saved_dtype = dtype or getattr(torch, stored)
    return write_model_folder(directory, model.config, shards(model, saved_dtype, max_shard_size), saved_dtype,
                              tokenizer, hf_tokenizer=hf_tokenizer, generation=generation)


def save_model(model: Llama, folder: Path, windows: Any, generation: bytes | None = None) -> Path:
    """A plain checkpoint's model: weights and config, lcft.json recording the tokenizer of `windows` (the
    training data), for a model tokenizer its files, and the generation_config.json `generation` of the model the
    run started from (None: none)."""
    return save_pretrained(model, folder, tokenizer=windows.manifest["tokenizer"], hf_tokenizer=hf_tokenizer_of(windows),
                           generation=generation)


def hf_tokenizer_of(windows: Any) -> Any:
    """The model tokenizer of a run's windows, whose files (lcft.genomics.hf_tokenizer) a checkpoint carries so
    that it also loads with transformers.AutoTokenizer and `lcft export` finds them; None for lcft's own
    vocabularies."""
    return windows.tokenizer if getattr(windows, "per_base", False) else None


def write_model_folder(directory: str | os.PathLike, cfg: LlamaConfig, weights: dict[str, Any],
                       saved_dtype: torch.dtype, tokenizer: dict[str, Any] | None = None,
                       meta: dict[str, Any] | None = None, hf_tokenizer: Any = None,
                       generation: bytes | None = None) -> Path:
    """Write a model folder from its config and {weight file name: tensor dict | function returning one |
    index bytes} (as lcft.model.hf_params.shards builds them): config.json, lcft.json (plus `meta`), the weights,
    and `generation` as generation_config.json, byte for byte (the source model's: lcft.checkpoint.reader.Loaded;
    None: none is written, and an earlier save's goes); atomically; then the files of `hf_tokenizer` (a model
    tokenizer: the one place they are saved)."""
    extra = {"format_version": MODEL_META_VERSION, "attention": cfg.attention.to_dict(),
             "tokenizer": tokenizer or tokenizer_spec(), **(meta or {})}
    files = {**weights, MODEL_CONFIG: json.dumps(config_to_hf(cfg, saved_dtype), indent=2).encode(),
             MODEL_META: json.dumps(extra, indent=2).encode()}
    if generation is not None:
        files[GENERATION_CONFIG] = generation
    directory = Path(directory)
    _write_folder(directory, files)
    if hf_tokenizer is not None:
        from lcft.genomics.hf_tokenizer import save_hf_tokenizer

        save_hf_tokenizer(hf_tokenizer, directory)
    return directory


def add_meta(directory: Path, meta: dict[str, Any]) -> None:
    """`meta` added to the lcft.json of the model folder `directory` (replaced in one rename)."""
    atomic_write(directory / MODEL_META, json.dumps({**read_meta_file(directory), **meta}, indent=2))


def read_config(directory: str | os.PathLike, attention: AttentionConfig | None = None) -> LlamaConfig:
    """The LlamaConfig of a checkpoint folder (attention from the argument, else lcft.json, else dense)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LcftError(f"checkpoint folder not found: {directory}")
    config_file(directory)
    if attention is None and present(directory / MODEL_META):  # (one that is no file: refused, not dense)
        block = read_meta_file(directory).get("attention", {})
        if not isinstance(block, dict):
            raise LcftError(f"{directory / MODEL_META}: attention is {shown(block, quoted=True)}, not an object")
        try:
            attention = AttentionConfig.from_dict(block)
        except (TypeError, LcftError) as e:  # an unknown field; a value of another kind or out of range
            raise LcftError(f"{directory / MODEL_META}: bad attention block ({reason(e)})") from None
    try:
        return config_from_hf(read_model_config(directory), attention)
    except KeyError as e:
        raise LcftError(f"{directory / MODEL_CONFIG}: missing field {e.args[0]!r}") from None


def from_pretrained(directory: str | os.PathLike, attention: AttentionConfig | None = None,
                    dtype: torch.dtype | None = None) -> Llama:
    """Load a model from a folder written by save_pretrained or by transformers (LlamaForCausalLM,
    MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM; safetensors, single or sharded,
    fp32/bf16/fp16 kept as stored unless dtype is given: training wants fp32 master weights of a bf16 checkpoint).
    attention overrides the backend recorded in lcft.json (e.g. continue a dense model as sparse)."""
    directory = Path(directory)
    cfg = read_config(directory, attention)
    check_weights(cfg, directory)  # the weight files' headers against config.json, before anything is built
    with torch.device("meta"):
        model = Llama(cfg)  # no init cost: every parameter is assigned from the files, tensor by tensor
    load_weights(model, directory, dtype)
    return model
