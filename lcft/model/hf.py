"""HuggingFace checkpoints of the five families lcft trains (Llama, Mistral, Qwen2, Qwen3, Mixtral): one table of
config.json fields used both ways, parameter names, and safetensors weights read and written tensor by tensor
(single file or shards with an index, fp32/bf16/fp16; pytorch_model.bin where a folder has no safetensors, read
by lcft.model.hf_weights without unpickling anything but plain data)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from lcft.errors import LcftError, reason
from lcft.model.config import (
    AttentionConfig,
    LlamaConfig,
    check_bool,
    check_counts,
    is_real,
    normalize_rope_scaling,
)
from lcft.model.hf_classes import shipped_classes
from lcft.model.hf_weights import INDEX, WEIGHTS, aligned, weight_files, weight_tensors

MAX_SHARD_BYTES = 5 * 1024**3  # transformers' classic max_shard_size ("5GB")

# config.json keys that every family reads and writes under the same name as the LlamaConfig field.
COMMON = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
          "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# The network's shape: a config.json must give it (transformers would fall back to its 7B default shape).
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Keys that describe the file, its own code or generation, not the network: read past, never written back (an
# export names the standard class, so transformers needs no remote code).
METADATA = frozenset({"architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype",
                      "dtype", "output_attentions", "output_hidden_states", "return_dict",
                      "tokenizer_class", "max_length", "min_length", "do_sample", "temperature", "top_p",
                      "top_k", "num_beams", "_attn_implementation_autoset", "bad_words_ids", "auto_map",
                      "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type"})
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
             "original_max_position_embeddings")  # the last: read into a llama3 / yarn table, as transformers does
_ROPE_TABLE_KEYS = set("rope_type type rope_theta factor original_max_position_embeddings truncate attention_factor "
                       "beta_fast beta_slow mscale mscale_all_dim low_freq_factor high_freq_factor partial_rotary_factor".split())
QWEN_WINDOW_KEYS = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")
# config.json keys read as true or false (where the family reads them): each must be a JSON boolean.
BOOL_KEYS = ("tie_word_embeddings", "use_cache", "attention_bias", "output_router_logits", "use_sliding_window",
             "mlp_bias")


@dataclass(frozen=True)
class Family:
    """How one HF architecture class maps onto LlamaConfig."""

    model_type: str
    architecture: str
    fields: tuple[str, ...] = ()
    """Family-specific keys stored under the LlamaConfig field's own name."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """config.json keys whose only value lcft honours (written on export, checked on load)."""
    implied: dict[str, Any] = field(default_factory=dict)
    """LlamaConfig fields the class fixes (set on load; a model with other values cannot be exported as it)."""
    shared_bias: bool = False
    """config.json `attention_bias` puts a bias on q, k, v and o_proj (Llama, Qwen3)."""
    window: str | None = None
    """'plain' = `sliding_window` for every layer (Mistral, Mixtral); 'qwen' = use_sliding_window +
    max_window_layers / layer_types."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """transformers' defaults of this class (its __init__'s) for keys a config.json leaves out; None for
    num_key_value_heads / head_dim = derived (num_attention_heads; hidden_size / num_attention_heads)."""


_NO_MOE = {"num_local_experts": 0, "output_router_logits": False}
_PLAIN_ATTN = {"attention_bias": False, "o_proj_bias": False, "qk_norm": False}
_BASE_FIXED = {"hidden_act": "silu", "attention_dropout": 0.0}
_SHAPE = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": None,
          "initializer_range": 0.02, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "use_cache": True}
_MISTRAL = {**_SHAPE, "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
            "max_position_embeddings": 131072}
_QWEN = {**_SHAPE, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
         "max_position_embeddings": 32768, "bos_token_id": None, "eos_token_id": None}

FAMILIES: dict[str, Family] = {f.architecture: f for f in (
    Family("llama", "LlamaForCausalLM", fixed={**_BASE_FIXED, "mlp_bias": False, "pretraining_tp": 1},
           implied={**_NO_MOE, "qk_norm": False, "sliding_window": None}, shared_bias=True,
           defaults={**_SHAPE, "vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": None,
                     "max_position_embeddings": 2048}),
    Family("mistral", "MistralForCausalLM", fixed=dict(_BASE_FIXED), implied={**_NO_MOE, **_PLAIN_ATTN},
           window="plain", defaults={**_MISTRAL, "sliding_window": 4096}),
    Family("qwen2", "Qwen2ForCausalLM", fixed=dict(_BASE_FIXED),
           implied={**_NO_MOE, "attention_bias": True, "o_proj_bias": False, "qk_norm": False}, window="qwen",
           defaults=_QWEN),
    Family("qwen3", "Qwen3ForCausalLM", fixed=dict(_BASE_FIXED), implied={**_NO_MOE, "qk_norm": True},
           shared_bias=True, window="qwen", defaults={**_QWEN, "head_dim": 128}),
    Family("mixtral", "MixtralForCausalLM",
           fields=("num_local_experts", "num_experts_per_tok", "output_router_logits", "router_aux_loss_coef"),
           fixed={**_BASE_FIXED, "router_jitter_noise": 0.0}, implied=dict(_PLAIN_ATTN), window="plain",
           defaults={**_MISTRAL, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
                     "router_aux_loss_coef": 0.001}),
)}
BY_TYPE = {f.model_type: f for f in FAMILIES.values()}


def family_of(d: dict[str, Any]) -> Family:
    """The family of a config.json: its `architectures` class when lcft knows it, else its model_type's (a
    custom class name, GENERatorForCausalLM say, loads as the class transformers would build for that
    model_type; its own code is never run)."""
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise LcftError(f"architectures {archs!r}: not a list of class names")
    if len(archs) == 1 and archs[0] in FAMILIES:
        return FAMILIES[archs[0]]
    model_type = d.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise LcftError(f"config.json model_type {model_type!r}: not a string (the name of a model type)")
    other = [a for a in archs if shipped_classes().get(a, model_type) != model_type]
    if model_type not in BY_TYPE or other or len(archs) > 1:
        raise LcftError(f"architectures {archs} (model_type {model_type!r}): not a Llama checkpoint or one of "
                        f"the other classes lcft trains ({', '.join(FAMILIES)})")
    return BY_TYPE[model_type]


def config_notes(d: dict[str, Any]) -> list[str]:
    """The lines to show when a config.json is loaded: a custom class loaded as its model_type's, and the keys
    carried without being used (each listed once)."""
    fam, notes = family_of(d), []
    archs = d.get("architectures") or []
    if archs != [fam.architecture] and archs:
        auto = d.get("auto_map") if isinstance(d.get("auto_map"), dict) else {}  # metadata: a note, never an error
        refs = {r for v in auto.values() for r in (v if isinstance(v, list) else [v]) if isinstance(r, str)}
        code = f" (auto_map {sorted(refs)})" if refs else ""  # AutoTokenizer's entry is a [slow, fast] list
        notes.append(f"architectures {archs} loaded as {fam.architecture} (model_type {fam.model_type}); the "
                     f"model's own code{code} was not run")
    carried = sorted(set(d) - _known_keys(fam))
    if carried:
        notes.append(f"config.json keys {fam.architecture} does not read, carried unchanged into every saved "
                     f"config.json: {', '.join(carried)}")
    return notes


def _known_keys(fam: Family) -> set[str]:
    known = set(COMMON) | set(fam.fields) | set(fam.fixed) | METADATA | set(ROPE_KEYS)
    known |= {"attention_bias"} if fam.shared_bias else set()
    return known | ({"sliding_window"} if fam.window == "plain" else set(QWEN_WINDOW_KEYS) if fam.window else set())


def _rope_to_hf(cfg: LlamaConfig) -> dict[str, Any]:
    """transformers 5.x reads rope_parameters, 4.x rope_theta + rope_scaling: write both."""
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
    return {"rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "rope_parameters": params}


def _rope_table(d: dict[str, Any], fam: Family) -> tuple[str, dict[str, Any]]:
    """(its key, the RoPE table) as transformers resolves it: `rope_scaling` as a whole, else `rope_parameters`; the
    table's rope_theta and partial_rotary_factor before the top-level ones; a top-level
    original_max_position_embeddings before a llama3 or yarn table's."""
    for key in ("rope_parameters", "rope_scaling"):
        if d.get(key) and not isinstance(d[key], dict):
            raise LcftError(f"{key}={d[key]!r} (an object)")
    where = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    table = dict(d.get(where) or {})
    table.setdefault("rope_theta", d.get("rope_theta", fam.defaults["rope_theta"]))
    table.setdefault("partial_rotary_factor", d.get("partial_rotary_factor"))
    if table.get("rope_type", table.get("type")) in ("llama3", "yarn") and "original_max_position_embeddings" in d:
        table["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    return where, table


def _rope_from_hf(d: dict[str, Any], fam: Family) -> dict[str, Any]:
    where, table = _rope_table(d, fam)
    extra = set(table) - _ROPE_TABLE_KEYS if where == "rope_parameters" else set()
    if extra:
        raise LcftError(f"rope_parameters field {sorted(extra)[0]!r}")
    rotary = table.pop("partial_rotary_factor", 1.0)
    if rotary not in (1, None):  # transformers' rope reads it beside rope_theta
        raise LcftError(f"partial_rotary_factor={rotary!r} (lcft rotates every dimension)")
    theta = table["rope_theta"]
    if not is_real(theta):  # its sign is LlamaConfig's check (check_counts)
        raise LcftError(f"rope_theta={theta!r} (a number)")
    return {"rope_theta": float(theta), "rope_scaling": normalize_rope_scaling(table, where) if table else None}


def _window_to_hf(cfg: LlamaConfig, fam: Family) -> dict[str, Any]:
    if fam.window == "plain":
        return {"sliding_window": cfg.sliding_window}
    if fam.window == "qwen":
        n, w = cfg.num_hidden_layers, cfg.sliding_window
        kind = "full_attention" if w is None else "sliding_attention"
        return {"use_sliding_window": w is not None, "sliding_window": w,
                "max_window_layers": n if w is None else 0, "layer_types": [kind] * n}
    return {}


def _window_from_hf(d: dict[str, Any], fam: Family) -> int | None:
    """The one window every layer uses; a per-layer pattern we do not implement is an error naming its field."""
    if fam.window == "plain":
        if d.get("layer_types") is not None:
            raise LcftError("layer_types (per-layer attention patterns)")
        return d.get("sliding_window", fam.defaults.get("sliding_window"))
    if fam.window != "qwen":
        return None
    n, w = d.get("num_hidden_layers", fam.defaults["num_hidden_layers"]), d.get("sliding_window")
    if d.get("layer_types") is not None:
        types = d["layer_types"]
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise LcftError(f"layer_types={types!r} (a list of attention kinds, one per layer)")
        kinds = set(types)
        if len(types) != n or not kinds <= {"full_attention", "sliding_attention"} or len(kinds) > 1:
            raise LcftError(f"layer_types {sorted(kinds)} (lcft applies one attention kind to every layer)")
        return w if kinds == {"sliding_attention"} else None
    if not d.get("use_sliding_window", False) or w is None:
        return None
    first = d.get("max_window_layers", 28)  # transformers: layers >= max_window_layers slide
    if isinstance(first, bool) or not isinstance(first, int):
        raise LcftError(f"max_window_layers={first!r} (a whole number of layers)")
    if 0 < first < n:
        raise LcftError(f"max_window_layers={first} (sliding window in some layers only)")
    return w if first <= 0 else None


def config_to_hf(cfg: LlamaConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """config.json of the model's own class, loadable by transformers 5.x and 4.x (carried keys written back)."""
    fam = BY_TYPE[cfg.model_type]
    for name, want in fam.implied.items():
        if getattr(cfg, name) != want:
            raise LcftError(f"{fam.architecture} cannot express {name}={getattr(cfg, name)!r} (model_type "
                            f"{cfg.model_type})")
    out: dict[str, Any] = {"architectures": [fam.architecture], "model_type": fam.model_type, **cfg.carried}
    out.update({k: getattr(cfg, k) for k in COMMON + fam.fields})
    out.update(fam.fixed)
    if fam.shared_bias:
        if cfg.attention_bias != cfg.o_proj_bias:
            raise LcftError(f"{fam.architecture} has one attention_bias for q/k/v and o_proj, the model has "
                            f"{cfg.attention_bias} and {cfg.o_proj_bias}")
        out["attention_bias"] = cfg.attention_bias
    out.update(_window_to_hf(cfg, fam))
    out.update(_rope_to_hf(cfg))
    out["dtype"] = str(dtype).removeprefix("torch.")
    return out


def _unsupported(d: dict[str, Any], fam: Family) -> tuple[list[str], dict[str, Any]]:
    """(every field lcft cannot honour, the rope and window fields read where they can be)."""
    problems = [f"{k}={d[k]!r} (lcft supports {want!r})" for k, want in fam.fixed.items()
                if d.get(k) is not None and d[k] != want]
    kw: dict[str, Any] = {}
    for key, read in (("rope", _rope_from_hf), ("sliding_window", _window_from_hf)):
        try:
            got = read(d, fam)
        except LcftError as e:  # gathered: one message names every field
            problems.append(str(e))
            continue
        kw.update(got if key == "rope" else {key: got})
    return problems, kw


def config_from_hf(d: dict[str, Any], attention: AttentionConfig | None = None) -> LlamaConfig:
    """LlamaConfig from a config.json written by us or by transformers 4.x/5.x, read as transformers' class for
    its model_type reads it (its defaults for absent keys, head_dim derived). Keys that class does not read are
    carried (LlamaConfig.carried); every value lcft cannot honour is named in one error."""
    if not isinstance(d, dict):
        raise LcftError("config.json is not a JSON object")
    fam = family_of(d)
    for key in REQUIRED:
        if key not in d:
            raise LcftError(f"config.json has no {key!r}")
    kw = {k: d[k] if k in d else fam.defaults.get(k) for k in COMMON + fam.fields}  # null stays null, as there
    if kw["num_key_value_heads"] is None:
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    check_counts(kw)  # first: everything below (and LlamaConfig's own checks) computes with these
    known = _known_keys(fam)
    for key in BOOL_KEYS:
        if key in d and key in known:  # a key the family does not read is carried as it is
            check_bool(key, d[key])
    problems, read = _unsupported(d, fam)
    if problems:
        raise LcftError(f"{fam.architecture} config: lcft cannot honour {'; '.join(problems)}")
    kw.update(read)
    kw.update(fam.implied)
    if fam.shared_bias:
        kw["attention_bias"] = kw["o_proj_bias"] = d.get("attention_bias", False)
    carried = {k: d[k] for k in sorted(set(d) - known)}
    return LlamaConfig(model_type=fam.model_type, attention=attention or AttentionConfig(), carried=carried, **kw)


# Our parameter names -> HF's (the block-level names differ: attn vs self_attn, norms, Mixtral's experts).
_BLOCK_RENAMES = ((r"attn\.", "self_attn."), (r"attn_norm\.", "input_layernorm."),
                  (r"mlp_norm\.", "post_attention_layernorm."), (r"mlp\.gate\.", "block_sparse_moe.gate."),
                  (r"mlp\.experts\.(\d+)\.gate_proj\.", r"block_sparse_moe.experts.\1.w1."),
                  (r"mlp\.experts\.(\d+)\.down_proj\.", r"block_sparse_moe.experts.\1.w2."),
                  (r"mlp\.experts\.(\d+)\.up_proj\.", r"block_sparse_moe.experts.\1.w3."))
IGNORED_HF = re.compile(r"rotary_emb\.inv_freq$")  # buffers some old HF checkpoints stored


def to_hf_name(name: str) -> str:
    """'layers.0.attn.q_proj.weight' -> 'model.layers.0.self_attn.q_proj.weight'."""
    if name.startswith("lm_head."):
        return name
    m = re.match(r"layers\.(\d+)\.(.*)$", name)
    if m:
        rest = m.group(2)
        for ours, theirs in _BLOCK_RENAMES:
            new = re.sub("^" + ours, theirs, rest)
            if new != rest:
                rest = new
                break
        return f"model.layers.{m.group(1)}.{rest}"
    return "model." + name


def load_weights(model: torch.nn.Module, directory: Path, dtype: torch.dtype | None = None) -> None:
    """Assign every parameter of a model built on the meta device from the folder's weights, one tensor at a
    time (as stored, or cast to dtype as it is read), so the peak is about one copy of the model plus one tensor."""
    params = dict(model.named_parameters())
    expected = {to_hf_name(n): n for n in params}
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    for f in weight_files(directory):
        try:
            for key, shape, read in weight_tensors(f):
                if key not in expected:
                    if IGNORED_HF.search(key) or (key == "lm_head.weight" and tied):
                        continue
                    raise LcftError(f"{f}: unexpected weight {key!r} (not a {model.config.model_type} "
                                    "checkpoint of this config.json?)")
                name = expected[key]
                if name in loaded:  # a second copy, in another shard: which one the model is would be chance
                    raise LcftError(f"{f}: weight {key} is stored twice (in two shard files of {directory})")
                if shape != tuple(params[name].shape):
                    raise LcftError(f"{f}: weight {key} has shape {shape}, config.json implies "
                                    f"{tuple(params[name].shape)}")
                tensor = read()
                if not tensor.is_floating_point():  # would be cast as read: train and eval on integers
                    raise LcftError(f"{f}: weight {key} holds {str(tensor.dtype).removeprefix('torch.')}, not "
                                    "floating-point numbers")
                _assign(model, name, aligned(tensor if dtype is None else tensor.to(dtype)))
                loaded.add(name)
        except (SafetensorError, OSError, ValueError, RuntimeError, MemoryError) as e:  # corrupt file
            raise LcftError(f"{f}: cannot read weights ({reason(e)})") from None
    missing = sorted(set(params) - loaded)
    if missing:
        names = ", ".join(to_hf_name(n) for n in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise LcftError(f"{directory}: {len(missing)} weight(s) missing: {names}")


def _assign(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=getattr(module, leaf).requires_grad))


def shards(model: torch.nn.Module, dtype: torch.dtype | None, max_bytes: int = MAX_SHARD_BYTES,
           read: Callable[[list[str]], dict[str, torch.Tensor]] | None = None
           ) -> dict[str, Callable[[], dict[str, torch.Tensor]] | bytes]:
    """{file name: tensors to write (built when called, so only one shard is ever copied at a time)}, plus the
    index as bytes when there is more than one shard (transformers' names: model-00001-of-0000N.safetensors).
    read(names) -> {name: tensor}: where a shard's tensors come from (default: the model's parameters; a model
    on the meta device with `read` streams them from elsewhere, e.g. a sharded checkpoint)."""
    groups: list[list[tuple[str, torch.nn.Parameter]]] = [[]]
    size = 0
    for name, p in model.named_parameters():
        nbytes = p.numel() * (dtype or p.dtype).itemsize
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += nbytes

    def tensors(group: list[tuple[str, torch.nn.Parameter]]) -> Callable[[], dict[str, torch.Tensor]]:
        def build() -> dict[str, torch.Tensor]:
            got = read([n for n, _ in group]) if read else {n: p.detach() for n, p in group}
            return {to_hf_name(n): (t.to(dtype) if dtype else t).cpu().contiguous() for n, t in got.items()}
        return build

    if len(groups) == 1:
        return {WEIGHTS: tensors(groups[0])}
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    total = sum(p.numel() * (dtype or p.dtype).itemsize for _, p in model.named_parameters())
    index = {"metadata": {"total_size": total},
             "weight_map": {to_hf_name(n): f for f, g in zip(names, groups, strict=True) for n, _ in g}}
    out: dict[str, Any] = {f: tensors(g) for f, g in zip(names, groups, strict=True)}
    out[INDEX] = json.dumps(index, indent=2).encode()
    return out


def stale_weight_files(directory: Path, keep: Iterator[str] | set[str]) -> list[Path]:
    """Weight files of an earlier save in `directory` that a new save with files `keep` must remove (else the
    folder would mix two models: model.safetensors is read before an index)."""
    keep = set(keep)
    if not directory.is_dir():
        return []
    old = [directory / WEIGHTS, directory / INDEX, *directory.glob("model-*-of-*.safetensors")]
    return [p for p in old if p.name not in keep and p.exists()]
