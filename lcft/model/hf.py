"""config.json of the five HuggingFace families lcft trains (Llama, Mistral, Qwen2, Qwen3, Mixtral) to and from
LlamaConfig: read as transformers' class for its model_type reads it, written back as that class, both by the one
table of lcft.model.hf_families."""

from __future__ import annotations

import json
from typing import Any

import torch

from lcft.errors import LcftError
from lcft.model.config import (
    AttentionConfig,
    LlamaConfig,
    check_bool,
    check_counts,
    is_real,
    normalize_rope_scaling,
)
from lcft.model.hf_classes import shipped_classes
from lcft.model.hf_families import (
    BOOL_KEYS,
    BY_TYPE,
    COMMON,
    FAMILIES,
    FIXED_SPELLINGS,
    FIXED_TYPES,
    METADATA,
    QWEN_WINDOW_KEYS,
    REQUIRED,
    ROPE_KEYS,
    Family,
)

_JSON_TYPES = {str: "a string", int: "an integer", float: "a float", type(None): "null"}
_ROPE_TABLE_KEYS = set("rope_type type rope_theta factor original_max_position_embeddings truncate attention_factor "
                       "beta_fast beta_slow mscale mscale_all_dim low_freq_factor high_freq_factor partial_rotary_factor".split())


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
    n = d.get("num_hidden_layers", fam.defaults["num_hidden_layers"])
    # transformers' Qwen2/Qwen3 config: sliding_window (default 4096) is null unless use_sliding_window (default off)
    w = d.get("sliding_window", fam.defaults["sliding_window"]) if d.get("use_sliding_window", False) else None
    if d.get("layer_types") is not None:
        types = d["layer_types"]
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise LcftError(f"layer_types={types!r} (a list of attention kinds, one per layer)")
        kinds = set(types)
        if len(types) != n or not kinds <= {"full_attention", "sliding_attention"} or len(kinds) > 1:
            raise LcftError(f"layer_types {sorted(kinds)} (lcft applies one attention kind to every layer)")
        if kinds == {"sliding_attention"} and w is None:  # transformers builds it, then fails at its first forward
            raise LcftError("layer_types 'sliding_attention' without a window (use_sliding_window false or "
                            "sliding_window null: transformers reads no window and cannot run it)")
        return w if kinds == {"sliding_attention"} else None
    if w is None:
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
    mistyped = {k for k in fam.fixed if k in d and type(d[k]) not in FIXED_TYPES.get(k, (type(d[k]),))}
    problems = [f"{k}={json.dumps(d[k])} (transformers trains with "
                f"{' or '.join(_JSON_TYPES[t] for t in FIXED_TYPES[k])} there)" for k in sorted(mistyped)]
    problems += [f"{k}=null (transformers builds no model of it)" for k in fam.null_refused if k in d and d[k] is None]
    if "num_local_experts" in fam.fields and d.get("num_local_experts") == 0:  # lcft's 0 is a plain MLP
        problems.append(f"num_local_experts=0 ({fam.architecture} routes every token to its experts: transformers "
                        "runs no model without one)")
    problems += [f"{k}={d[k]!r} (lcft supports {want!r})" for k, want in fam.fixed.items()
                 if k not in mistyped and d.get(k) is not None and d[k] not in (want, *FIXED_SPELLINGS.get(k, ()))]
    quant = d.get("quantization_config")
    if quant:  # transformers too reads an empty or null one as none; carried, it would describe float weights
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        problems.append(f"quantization_config (quant_method {method!r}: lcft reads, trains and writes float "
                        "weights, not quantized ones)")
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
