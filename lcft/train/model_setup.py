"""The model a run trains: fresh from a preset, from `--init`, or from the checkpoint it resumes; with the
attention and RoPE overrides applied and the vocabulary checked against the data's tokenizer, in one read of the
checkpoint folder."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lcft.checkpoint.hf_folder import read_config
from lcft.checkpoint.layout import check_tokenizer, read_checkpoint, read_model_config, unchanged
from lcft.checkpoint.reader import Loaded, load
from lcft.errors import LcftError
from lcft.model import AttentionConfig, Llama, LlamaConfig, preset
from lcft.model.hf import config_notes
from lcft.train.config import ModelOverrides, TrainConfig, parse_rope_scaling


def attention_override(cfg: ModelOverrides, base: AttentionConfig) -> AttentionConfig:
    """The model's attention settings with the options the user gave (None = keep the model's): the one place
    where the flat train options become the attention config and its SparseSpec."""
    spec = {"block_size": cfg.block_size, "top_k": cfg.top_k, "local_blocks": cfg.local_blocks,
            "sink_blocks": cfg.sink_blocks}
    top = {"backend": cfg.attention, "impl": cfg.attention_impl}
    sparse = dataclasses.replace(base.sparse, **{k: v for k, v in spec.items() if v is not None})
    return dataclasses.replace(base, sparse=sparse, **{k: v for k, v in top.items() if v is not None})


def _rope_changes(cfg: ModelOverrides, model_cfg: LlamaConfig) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if cfg.rope_theta is not None and cfg.rope_theta != model_cfg.rope_theta:
        changes["rope_theta"] = float(cfg.rope_theta)
    if cfg.rope_scaling is not None:
        scaling = parse_rope_scaling(cfg.rope_scaling)
        if scaling != model_cfg.rope_scaling:
            changes["rope_scaling"] = scaling
    return changes


def build_model(cfg: TrainConfig, tokenizer: dict[str, Any], resume_from: Path | None, materialize: bool = True,
                note: Callable[[str], None] | None = None) -> tuple[Llama, Loaded | None]:
    """The model to train: the checkpoint `resume_from`'s, else `--init`'s, else a fresh one from cfg.preset
    (seeded); with what was read of the checkpoint (its folder and identity: a sharded one's shards are read
    after FSDP shards the model, against that identity). An --init run folder means its latest checkpoint, which
    that run may prune while it is read: then its latest is resolved again and read once more
    (lcft.checkpoint.layout.read_checkpoint). materialize=False: a sharded (DCP) source's model stays on the
    meta device, for FSDP to shard before each rank reads its part (lcft.checkpoint.dcp.load_state). note: shows
    what loading the source's config.json has to say (a custom class loaded as its model_type's, keys carried
    unread)."""
    def read(source: Path) -> Loaded:
        return read_source(cfg, tokenizer, source, materialize, note)

    if resume_from is not None:
        source = read(resume_from)
    elif cfg.init:
        source = read_checkpoint(cfg.init, read)  # a run: its latest (resolve_checkpoint verifies it)
    else:
        return fresh_model(cfg, tokenizer), None
    assert source.model is not None  # (read_source reads the model)
    return source.model, source


def fresh_model(cfg: TrainConfig, tokenizer: dict[str, Any]) -> Llama:
    """A model of cfg.preset with the data's vocabulary and the attention and RoPE options, seeded."""
    model_cfg = preset_config(cfg.preset, tokenizer)
    model_cfg.attention = attention_override(cfg.model, model_cfg.attention)
    model_cfg = dataclasses.replace(model_cfg, **_rope_changes(cfg.model, model_cfg))
    torch.manual_seed(cfg.seed)
    return Llama(model_cfg)


def preset_config(name: str, tokenizer: dict[str, Any]) -> LlamaConfig:
    """Preset `name` as a fresh model over data of this tokenizer (its manifest's spec) gets it, for train and
    plan alike: a model tokenizer's vocab_size becomes the embedding's and the head's rows; lcft's own must be
    the preset's."""
    model_cfg = preset(name)
    if "sha256" in tokenizer:  # a model tokenizer: the fresh model's embedding has its vocabulary's rows
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer["vocab_size"])
    if model_cfg.vocab_size != tokenizer["vocab_size"]:
        raise LcftError(f"preset {name!r} has vocab_size {model_cfg.vocab_size}, the data's tokenizer "
                        f"{tokenizer['vocab_size']}")
    return model_cfg


def read_source(cfg: TrainConfig, tokenizer: dict[str, Any], source: Path, materialize: bool = True,
                note: Callable[[str], None] | None = None) -> Loaded:
    """The model of the checkpoint folder `source`, with the attention and RoPE options. Its tokenizer check,
    config.json and weights are read as one folder (lcft.checkpoint.layout.unchanged): another run pruning it or
    saving it again meanwhile is one line (CheckpointChanged), never one checkpoint's tokenizer checked and
    another's weights trained."""
    with unchanged(source) as identity:
        if not source.is_dir():
            raise LcftError(f"checkpoint folder not found: {source}")
        check_tokenizer(source, tokenizer)
        notes = config_notes(read_model_config(source)) if note is not None else []
        # fp32 master weights whatever the checkpoint's dtype (published ones are mostly bf16; --precision bf16 is
        # autocast over fp32 weights)
        loaded = load(source, attention=attention_override(cfg.model, read_config(source).attention),
                      materialize=materialize, dtype=torch.float32, since=identity)
    if note is not None:  # once the folder was read whole (not twice where a run's latest is read once more)
        for line in notes:
            note(f"note: {line}")
    model = loaded.model
    assert model is not None  # (load reads the model unless asked not to)
    rope = _rope_changes(cfg.model, model.config)
    if rope:  # RoPE holds no weights: a model of the new config takes the loaded weights as they are
        on_meta = next(model.parameters()).is_meta
        with torch.device("meta" if on_meta else "cpu"):
            fresh = Llama(dataclasses.replace(model.config, **rope))
        if not on_meta:
            fresh.load_state_dict(model.state_dict(), strict=True)
        loaded.model = fresh
    return loaded


def declare_context(model_cfg: LlamaConfig, seq_len: int) -> str | None:
    """A run longer than the model's max_position_embeddings raises it to seq_len, so its checkpoints declare
    the context they were trained at; returns the warning to show (None within the declared context). Dynamic
    RoPE scaling reads max_position_embeddings as its original length: there it is kept, and the warning says
    so (yarn and llama3 keep their original length in rope_scaling, so raising it changes no frequency)."""
    old = model_cfg.max_position_embeddings
    if seq_len <= old:
        return None
    head = f"--seq-len {seq_len} is longer than the model's max_position_embeddings {old}"
    scaling = model_cfg.rope_scaling
    if scaling is not None and scaling["rope_type"] == "dynamic":
        return f"{head}; dynamic RoPE scaling takes it as the original length, so it is kept"
    model_cfg.max_position_embeddings = seq_len
    hint = "" if scaling else f" (RoPE is not rescaled; --rope-scaling yarn:{seq_len / old:g}:{old} would interpolate)"
    return f"{head}; the checkpoints record max_position_embeddings {seq_len}{hint}"


def taken_overrides(cfg: ModelOverrides, source: Path | None, preset_name: str) -> dict[str, Any]:
    """The model options (attention and RoPE) as the model trained has them: `source`'s config (the resumed
    checkpoint, or --init's folder), else preset `preset_name`'s, with those given applied, so that an option left
    unset and the same option given the value the model has are one value; its RoPE scaling as the model's config
    holds it (a spelling normalized, the defaults its type takes filled in)."""
    base = read_config(source) if source is not None else preset(preset_name)
    attn = attention_override(cfg, base.attention)
    built = dataclasses.replace(base, **_rope_changes(cfg, base))  # checked and normalized as the run's model is
    return {"attention": attn.backend, "attention_impl": attn.impl, "block_size": attn.sparse.block_size,
            "top_k": attn.sparse.top_k, "local_blocks": attn.sparse.local_blocks,
            "sink_blocks": attn.sparse.sink_blocks, "rope_theta": built.rope_theta, "rope_scaling": built.rope_scaling}
