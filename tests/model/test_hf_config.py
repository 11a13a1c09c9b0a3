"""config.json read the way transformers reads it: for each family lcft trains, the same defaults and derived
fields as transformers' config class from the same dict; keys that class does not read carried through export;
custom class names loaded as their model_type's class; every value lcft cannot honour named in one line."""

from __future__ import annotations

import inspect
import json

import pytest

from lcft.errors import LcftError
from lcft.model.hf import _known_keys, config_from_hf, config_notes, config_to_hf
from lcft.model.hf_families import BY_TYPE, COMMON
from tests.conftest import SHARED_PUBLISHED as PUBLISHED

transformers = pytest.importorskip("transformers")

CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "mixtral": "MixtralConfig"}
# A GenomeOcean-like config (Mistral with the keys its published config.json adds: auto_map, classifier_dropout,
# is_causal), built here from that description.
GENOMEOCEAN = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 768,
               "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
               "num_key_value_heads": 4, "vocab_size": 4096, "max_position_embeddings": 10240,
               "sliding_window": None, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2,
               "pad_token_id": 3, "classifier_dropout": 0.1, "is_causal": True, "torch_dtype": "bfloat16",
               "auto_map": {"AutoModelForCausalLM": "modeling_mistral.MistralForCausalLM"}}


def published(name: str) -> dict:
    path = PUBLISHED / name / "config.json"
    if not path.is_file():
        pytest.skip(f"published files not found at {PUBLISHED}")
    return json.loads(path.read_text())


def transformers_view(d: dict) -> dict:
    """What transformers' class for the model_type computes from d: lcft's field names, values as it holds them."""
    cls = getattr(transformers, CLASSES[d["model_type"]])
    c = cls(**{k: v for k, v in d.items() if k != "model_type"})
    out = {k: getattr(c, k, None) for k in COMMON}
    out["head_dim"] = out["head_dim"] or c.hidden_size // c.num_attention_heads  # as its attention computes it
    out["rope_theta"] = c.rope_parameters["rope_theta"]
    if d["model_type"] in ("mistral", "mixtral"):
        out["sliding_window"] = c.sliding_window
    if d["model_type"] == "mixtral":
        out.update({k: getattr(c, k) for k in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef")})
    return out


def cases() -> list[tuple[str, dict]]:
    shape = {"vocab_size": 64, "hidden_size": 1024, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 32}  # what a config.json must give; everything else defaults
    minimal = [(f"{t}-defaults", {"model_type": t, **shape}) for t in CLASSES]
    given = [("llama-gqa", {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
                            "num_key_value_heads": 2, "vocab_size": 100, "bos_token_id": None,
                            "intermediate_size": 96, "num_hidden_layers": 2}),
             ("qwen3-derived-kv", {"model_type": "qwen3", "hidden_size": 256, "num_attention_heads": 4,
                                  "num_key_value_heads": None, "head_dim": 32, "vocab_size": 64,
                                  "intermediate_size": 96, "num_hidden_layers": 2}),
             ("mixtral-small", {"model_type": "mixtral", "num_local_experts": 4, "rope_theta": 5e5, "vocab_size": 64,
                               "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                               "num_attention_heads": 8}),
             ("genomeocean", GENOMEOCEAN)]
    return minimal + given


@pytest.mark.parametrize("name,d", cases(), ids=[n for n, _ in cases()])
def test_fields_equal_transformers_class(name, d):
    cfg = config_from_hf(d)
    want = transformers_view(d)
    assert {k: getattr(cfg, k) for k in want} == want


@pytest.mark.parametrize("folder", ["metagene-1", "generator-eukaryote-3b-base"])
def test_published_configs_equal_transformers_class(folder):
    d = published(folder)
    cfg = config_from_hf(d)
    want = transformers_view(d)
    assert {k: getattr(cfg, k) for k in want} == want


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_every_key_the_class_reads_is_read_or_dropped(model_type):
    """A key the transformers class takes in its __init__ is never carried unread (it may change the math)."""
    params = set(inspect.signature(getattr(transformers, CLASSES[model_type]).__init__).parameters) - {"self"}
    params |= {"rope_theta", "rope_scaling", "partial_rotary_factor"}  # popped by its RoPE mixin from kwargs
    assert params - _known_keys(BY_TYPE[model_type]) == set()


def test_metagene_extra_keys_are_carried_through_export():
    d = published("metagene-1")
    cfg = config_from_hf(d)
    extra = {"mask_token_id": 5, "max_sequence_length": 2048, "sep_token_id": 2, "unk_token_id": 1}
    assert cfg.carried == extra
    out = config_to_hf(cfg)
    assert {k: out[k] for k in extra} == extra and config_from_hf(out) == cfg
    assert config_notes(d) == ["config.json keys LlamaForCausalLM does not read, carried unchanged into every "
                               "saved config.json: mask_token_id, max_sequence_length, sep_token_id, unk_token_id"]
    assert config_notes(out) == config_notes(d)  # listed once per load, the same on every later load


def test_custom_class_loads_as_its_model_type_and_exports_the_standard_class():
    d = published("generator-eukaryote-3b-base")
    cfg = config_from_hf(d)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.intermediate_size) == \
        ("llama", 30, 4, 8448)
    assert cfg.carried == {}
    assert config_notes(d) == ["architectures ['GENERatorForCausalLM'] loaded as LlamaForCausalLM (model_type "
                               "llama); the model's own code (auto_map ['modeling_generator.GENERatorForCausalLM']) "
                               "was not run"]
    out = config_to_hf(cfg)
    assert out["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in out
    assert config_notes(out) == []
    without_code = {k: v for k, v in d.items() if k != "auto_map"}
    assert config_from_hf(without_code) == cfg
    assert config_notes(without_code)[0].endswith("the model's own code was not run")


def test_genomeocean_keys_load_and_are_carried():
    cfg = config_from_hf(GENOMEOCEAN)
    assert cfg.carried == {"classifier_dropout": 0.1, "is_causal": True}
    assert config_to_hf(cfg)["is_causal"] is True and "auto_map" not in config_to_hf(cfg)


def test_every_unsupported_value_is_named_in_one_line():
    d = {**published("generator-eukaryote-3b-base"), "hidden_act": "gelu", "attention_dropout": 0.1,
         "rope_scaling": {"rope_type": "longrope", "factor": 2.0}}
    with pytest.raises(LcftError) as e:
        config_from_hf(d)
    msg = str(e.value)
    assert "\n" not in msg and "hidden_act='gelu'" in msg and "attention_dropout=0.1" in msg and "longrope" in msg
    mistral = {**GENOMEOCEAN, "layer_types": ["sliding_attention"] * 12, "hidden_act": "relu"}
    with pytest.raises(LcftError, match=r"hidden_act='relu'.*layer_types"):
        config_from_hf(mistral)


def test_another_familys_class_is_refused_a_custom_one_is_not():
    d = published("generator-eukaryote-3b-base")
    for archs in (["FalconForCausalLM"], ["GPT2LMHeadModel"], ["MyDNAForCausalLM", "LlamaForCausalLM"]):
        with pytest.raises(LcftError, match="not a Llama checkpoint"):  # another family's class, or two
            config_from_hf({**d, "architectures": archs})
    assert config_from_hf({**d, "architectures": ["MyDNAForCausalLM"]}).model_type == "llama"
    with pytest.raises(LcftError, match="partial_rotary_factor=0.5"):
        config_from_hf({**d, "partial_rotary_factor": 0.5})


@pytest.mark.parametrize("quant, method", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}, "'awq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "'fp8'")])
def test_a_quantized_config_is_refused_naming_its_method(quant, method):
    d = published("generator-eukaryote-3b-base")
    with pytest.raises(LcftError) as e:  # carried, it would describe the float weights lcft writes
        config_from_hf({**d, "quantization_config": quant})
    assert "\n" not in str(e.value) and f"quantization_config (quant_method {method}" in str(e.value)
    for none in (None, {}):  # transformers reads these as no quantization: so does lcft, and carries them as they are
        assert config_from_hf({**d, "quantization_config": none}).carried["quantization_config"] == none


@pytest.mark.parametrize("family", list(CLASSES))
def test_hidden_act_is_read_as_transformers_builds_it(tmp_path, family):
    """transformers' ACT2FN maps "swish" to SiLU as it maps "silu" (lcft refused "swish"); a null hidden_act builds
    no model there (lcft read it as silu): refused in one line naming it."""
    import torch

    from lcft.checkpoint.hf_folder import from_pretrained

    shape = dict(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1)
    cls = getattr(transformers, CLASSES[family])
    torch.manual_seed(0)
    theirs = getattr(transformers, cls.__name__.replace("Config", "ForCausalLM"))(cls(**shape, hidden_act="swish"))
    theirs.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hidden_act"] == "swish"
    ids = torch.randint(0, 16, (1, 12))
    with torch.no_grad():
        assert torch.allclose(from_pretrained(tmp_path).eval()(ids), theirs.eval()(ids).logits, atol=1e-5)
    d = {"model_type": family, **shape, "hidden_act": None}
    with pytest.raises(Exception):  # noqa: B017 (the oracle: transformers' own refusal, whatever its class)
        cls(**d)
    with pytest.raises(LcftError, match=r"cannot honour hidden_act=null \(transformers trains with a string there\)$"):
        config_from_hf(d)


# JSON spellings of the one value lcft honours for a fixed key: transformers trains with some and refuses the
# others (its config: null jitter, an integer jitter, a boolean dropout or pretraining_tp; its training: Llama's
# null dropout, a null jitter compared with `> 0`).
FIXED_SPELLING_CASES = ([("mixtral", "router_jitter_noise", v) for v in (None, 0, False, 0.0)]
                        + [("llama", "attention_dropout", v) for v in (None, False, 0, 0.0)]
                        + [("mistral", "attention_dropout", None), ("qwen3", "attention_dropout", False)]
                        + [("llama", "pretraining_tp", v) for v in (True, 1.0, None, 1)])


@pytest.mark.parametrize(("family", "key", "value"), FIXED_SPELLING_CASES)
def test_fixed_keys_are_read_as_transformers_trains_them(family, key, value):
    """lcft reads a fixed key's value exactly when transformers builds and trains a model of it (lcft read a null
    or integer router_jitter_noise, a null or false attention_dropout as 0.0 and a true pretraining_tp as 1);
    the rest is refused in one line naming the key and its JSON spelling."""
    import torch

    shape = dict(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, **({"num_local_experts": 2} if family == "mixtral" else {}))
    cls = getattr(transformers, CLASSES[family])
    torch.manual_seed(0)
    ids = torch.randint(0, 16, (1, 8))
    try:
        model = getattr(transformers, cls.__name__.replace("Config", "ForCausalLM"))(cls(**shape, **{key: value}))
        model.train()(ids, labels=ids).loss.backward()
        trains = True
    except Exception:  # noqa: BLE001 (the oracle: transformers' own refusal, at its config or in training)
        trains = False
    d = {"model_type": family, **shape, key: value}
    if trains:
        assert config_from_hf(d).model_type == family
        return
    with pytest.raises(LcftError, match=rf"cannot honour {key}={json.dumps(value)} \(transformers trains with "
                                        r"[a-z ]+ there\)$"):
        config_from_hf(d)


SLIDING = ["sliding_attention"] * 2
QWEN_WINDOWS = {  # (use_sliding_window, sliding_window, layer_types); None = the key left out
    "off-sliding-types": (False, 8, SLIDING),
    "unset-sliding-types": (None, 8, SLIDING),
    "on-null-window-sliding-types": (True, "null", SLIDING),
    "on-sliding-types": (True, 8, SLIDING),
    "on-default-window": (True, None, None),
    "off-window": (False, 8, None),
}


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("case", list(QWEN_WINDOWS))
def test_qwen_window_is_read_as_transformers_reads_it(family, case):
    """transformers' Qwen2/Qwen3 config takes sliding_window (default 4096) only with use_sliding_window (default
    off): lcft applied sliding_window 8 beside use_sliding_window false and layer_types all sliding (transformers
    reads no window there and fails at the first forward: refused), and no window for use_sliding_window true
    without a sliding_window key (transformers: 4096)."""
    use, window, types = QWEN_WINDOWS[case]
    d = {"model_type": family, "vocab_size": 16, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_window_layers": 0}
    given = {"use_sliding_window": use, "sliding_window": None if window == "null" else window, "layer_types": types}
    d.update({k: v for k, v in given.items() if v is not None or (k == "sliding_window" and window == "null")})
    theirs = getattr(transformers, CLASSES[family])(**{k: v for k, v in d.items() if k != "model_type"})
    if theirs.sliding_window is None and "sliding_attention" in theirs.layer_types:
        with pytest.raises(LcftError, match=r"layer_types 'sliding_attention' without a window"):
            config_from_hf(d)
    else:
        assert config_from_hf(d).sliding_window == theirs.sliding_window


@pytest.mark.parametrize("family", list(CLASSES))
def test_a_null_head_dim_is_read_as_transformers_builds_it(family):
    """Llama, Mistral and Mixtral derive a null head_dim (hidden / heads); Qwen2 and Qwen3 take it as the head width
    and build no model of it (lcft derived it there too): refused in one line naming it."""
    import torch

    shape = dict(vocab_size=16, hidden_size=64, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=None)
    cls = getattr(transformers, CLASSES[family])
    try:
        theirs = getattr(transformers, cls.__name__.replace("Config", "ForCausalLM"))(cls(**shape))
        theirs.eval()(torch.tensor([[1, 2, 3]]))
        width = theirs.model.layers[0].self_attn.q_proj.out_features // 2  # as its attention computes it
    except Exception:  # noqa: BLE001 (the oracle: transformers' own refusal, at its config or building the model)
        width = None
    d = {"model_type": family, **shape}
    if width is not None:
        assert config_from_hf(d).head_dim == width == 32
        return
    with pytest.raises(LcftError, match=r"cannot honour head_dim=null \(transformers builds no model of it\)$"):
        config_from_hf(d)


def test_a_mixtral_without_experts_is_refused():
    """num_local_experts 0 is lcft's plain MLP: a Mixtral config.json giving it was read as a dense model, which
    transformers' MixtralForCausalLM cannot run (nor save); refused in one line naming it."""
    import torch

    shape = dict(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, num_local_experts=0)
    with pytest.raises(RuntimeError):  # the oracle: transformers' own failure routing to no expert
        transformers.MixtralForCausalLM(transformers.MixtralConfig(**shape)).eval()(torch.tensor([[1, 2, 3]]))
    with pytest.raises(LcftError, match=r"cannot honour num_local_experts=0 \(MixtralForCausalLM routes .*\)$"):
        config_from_hf({"model_type": "mixtral", **shape})
    one = {"model_type": "mixtral", **shape, "num_local_experts": 1, "num_experts_per_tok": 1}
    assert config_from_hf(one).num_local_experts == 1
