"""Checkpoint I/O in HuggingFace's Llama layout: config.json + model.safetensors (+ lcft.json for lcft's own
attention settings and the tokenizer spec). Folders written by transformers load too."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lcft.errors import LcftError
from lcft.files import read_json, replacing
from lcft.genomics.tokenizer import BOS, EOS, tokenizer_spec
from lcft.model.config import AttentionConfig, LlamaConfig, normalize_rope_scaling
from lcft.model.llama import Llama

LCFT_FORMAT_VERSION = 1
WEIGHTS, INDEX, CONFIG, LCFT = "model.safetensors", "model.safetensors.index.json", "config.json", "lcft.json"

# Our parameter names -> HF LlamaForCausalLM's (the block-level names differ: attn vs self_attn, norms).
_BLOCK_RENAMES = (("attn.", "self_attn."), ("attn_norm.", "input_layernorm."),
                  ("mlp_norm.", "post_attention_layernorm."))
_IGNORED_HF = re.compile(r"rotary_emb\.inv_freq$")  # buffers some old HF checkpoints stored


def to_hf_name(name: str) -> str:
    """'layers.0.attn.q_proj.weight' -> 'model.layers.0.self_attn.q_proj.weight'."""
    if name.startswith("lm_head."):
        return name
    m = re.match(r"layers\.(\d+)\.(.*)$", name)
    if m:
        rest = m.group(2)
        for ours, theirs in _BLOCK_RENAMES:
            if rest.startswith(ours):
                rest = theirs + rest[len(ours):]
                break
        return f"model.layers.{m.group(1)}.{rest}"
    return "model." + name


def config_to_hf(cfg: LlamaConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """config.json content that transformers 5.x (rope_parameters) and 4.x (rope_theta + rope_scaling) load."""
    rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings, "initializer_range": cfg.initializer_range,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "rope_parameters": rope_parameters,
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        # pad_token_id stays null: HF would make it the embedding's padding_idx (a row that never gets a
        # gradient), so continued training in transformers would differ from ours. lcft.json has the vocab.
        "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": None, "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def config_from_hf(d: dict[str, Any], attention: AttentionConfig | None = None) -> LlamaConfig:
    """LlamaConfig from a config.json written by us or by transformers 4.x/5.x."""
    if d.get("model_type") != "llama" and "LlamaForCausalLM" not in d.get("architectures", []):
        raise LcftError(f"not a Llama checkpoint (model_type {d.get('model_type')!r})")
    unsupported = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
    for key, want in unsupported.items():
        if d.get(key, want) != want:
            raise LcftError(f"unsupported Llama variant: {key}={d[key]!r} (lcft supports {key}={want!r})")
    if d.get("pretraining_tp", 1) not in (1, None):
        raise LcftError("unsupported Llama variant: pretraining_tp != 1")
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or params
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    heads = d["num_attention_heads"]
    if d.get("head_dim") not in (None, d["hidden_size"] // heads):
        raise LcftError(f"unsupported Llama variant: head_dim {d['head_dim']} != hidden_size / heads")
    return LlamaConfig(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads, rope_theta=float(theta),
        rope_scaling=normalize_rope_scaling(scaling) if scaling else None,
        max_position_embeddings=d.get("max_position_embeddings", 2048), rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        initializer_range=d.get("initializer_range", 0.02), attention=attention or AttentionConfig())


def _write_folder(directory: Path, files: dict[str, Any]) -> None:
    """Write {name: bytes | tensor dict} atomically: a fresh folder appears complete under its name (temp
    sibling + rename); into an existing folder each file is written to a temp name and renamed, weights
    first and config.json last, so a half-written folder never looks loadable."""
    def write(dst: Path, name: str) -> None:
        value = files[name]
        if isinstance(value, dict):
            save_file(value, str(dst), metadata={"format": "pt"})
        else:
            dst.write_bytes(value)

    order = sorted(files, key=lambda n: n == CONFIG)
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
        try:
            for name in order:
                write(tmp / name, name)
            os.replace(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return
    if not directory.is_dir():
        raise LcftError(f"{directory} exists and is not a folder")
    for name in order:
        with replacing(directory / name) as tmp:
            write(tmp, name)


def save_pretrained(model: Llama, directory: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write config.json, model.safetensors (HF Llama names) and lcft.json; loadable by
    transformers.LlamaForCausalLM.from_pretrained and by from_pretrained here. dtype: cast weights (None = keep)."""
    cfg = model.config
    tensors = {to_hf_name(n): (p.detach().to(dtype) if dtype else p.detach()).cpu().contiguous()
               for n, p in model.named_parameters()}
    saved_dtype = next(iter(tensors.values())).dtype
    extra = {"format_version": LCFT_FORMAT_VERSION, "attention": dataclasses.asdict(cfg.attention),
             "tokenizer": tokenizer_spec()}
    files = {WEIGHTS: tensors,
             CONFIG: json.dumps(config_to_hf(cfg, saved_dtype), indent=2).encode(),
             LCFT: json.dumps(extra, indent=2).encode()}
    directory = Path(directory)
    _write_folder(directory, files)
    return directory


def _weight_files(directory: Path) -> list[Path]:
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    if (directory / INDEX).is_file():
        shards = sorted(set(read_json(directory / INDEX).get("weight_map", {}).values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing or not shards:
            raise LcftError(f"{directory}: weight shard(s) missing: {', '.join(missing) or 'index is empty'}")
        return [directory / s for s in shards]
    if (directory / "pytorch_model.bin").is_file():
        raise LcftError(f"{directory}: only pytorch_model.bin found; lcft reads safetensors weights "
                        "(re-save with transformers' save_pretrained(safe_serialization=True))")
    raise LcftError(f"{directory}: no {WEIGHTS} (or sharded {INDEX}) found")


def read_config(directory: str | os.PathLike, attention: AttentionConfig | None = None) -> LlamaConfig:
    """The LlamaConfig of a checkpoint folder (attention from the argument, else lcft.json, else dense)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LcftError(f"checkpoint folder not found: {directory}")
    if not (directory / CONFIG).is_file():
        raise LcftError(f"{directory}: no {CONFIG}; not a model checkpoint folder")
    if attention is None and (directory / LCFT).is_file():
        extra = read_json(directory / LCFT)
        try:
            attention = AttentionConfig(**extra.get("attention", {}))
        except TypeError as e:
            raise LcftError(f"{directory / LCFT}: bad attention block ({e})") from None
    try:
        return config_from_hf(read_json(directory / CONFIG), attention)
    except KeyError as e:
        raise LcftError(f"{directory / CONFIG}: missing field {e.args[0]!r}") from None


def from_pretrained(directory: str | os.PathLike, attention: AttentionConfig | None = None) -> Llama:
    """Load a Llama from a folder written by save_pretrained or by transformers (safetensors, single or
    sharded). attention overrides the backend recorded in lcft.json (e.g. continue a dense model as sparse)."""
    directory = Path(directory)
    cfg = read_config(directory, attention)
    files = _weight_files(directory)
    with torch.device("meta"):
        model = Llama(cfg)  # no init cost: every parameter is assigned from the file below
    expected = {to_hf_name(n): n for n, _ in model.named_parameters()}
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if key in expected:
                        state[expected[key]] = sf.get_tensor(key)
                    elif _IGNORED_HF.search(key) or (key == "lm_head.weight" and cfg.tie_word_embeddings):
                        continue
                    else:
                        raise LcftError(f"{f}: unexpected weight {key!r} (not a plain Llama checkpoint?)")
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # truncated or corrupt file
            raise LcftError(f"{f}: cannot read weights ({e})") from None
    missing = sorted(set(expected.values()) - set(state))
    if missing:
        names = ", ".join(to_hf_name(n) for n in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise LcftError(f"{directory}: {len(missing)} weight(s) missing: {names}")
    for name, p in model.named_parameters():
        if state[name].shape != p.shape:
            raise LcftError(f"{directory}: weight {to_hf_name(name)} has shape {tuple(state[name].shape)}, "
                            f"config.json implies {tuple(p.shape)}")
    model.load_state_dict(state, assign=True, strict=True)
    return model


def export_pretrained(checkpoint: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype | None = None,
                      force: bool = False) -> Path:
    """Write the model of a checkpoint folder to `out` as an HF Llama folder (a run folder is resolved to its
    latest checkpoint by lcft.runs.resolve_checkpoint, before this is called)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise LcftError(f"{out} already exists and is not empty (use --force to overwrite)")
    model = from_pretrained(checkpoint)
    return save_pretrained(model, out, dtype=dtype)
