"""Wrong types and values in a model folder's config files are one line naming the field, from loading and from
`lcft plan --init`, never a traceback: config.json's model_type, a Qwen model's layer_types and
max_window_layers, every field of rope_scaling / rope_parameters, a rope_theta or factor whose frequencies overflow
fp32, Mixtral's router_aux_loss_coef, reals past what float32 computes with, token ids outside the vocabulary, lcft.json's attention block. The RoPE
scalings that published models use still load, with transformers' own frequencies."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import read_config, save_pretrained
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.model import Llama, LlamaConfig
from lcft.model.hf import config_from_hf, config_notes
from lcft.model.rope import rope_frequencies
from lcft.train.config import parse_rope_scaling
from tests.conftest import SHARED_PUBLISHED as PUBLISHED

runner = CliRunner()
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 16, "hidden_size": 128,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096}
QWEN = {**BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
QWEN_WINDOW = {**QWEN, "use_sliding_window": True, "sliding_window": 64}
MIXTRAL = {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4}


def rope(**scaling) -> dict:
    return {**BASE, "rope_scaling": scaling}


# (case, config.json, text its one line must hold: the field and the value it was given)
BAD_CONFIGS = [
    ("model_type_list", {**BASE, "architectures": None, "model_type": ["x"]}, "model_type ['x']"),
    ("model_type_dict", {**BASE, "architectures": None, "model_type": {"a": 1}}, "model_type {'a': 1}"),
    ("layer_types_int", {**QWEN, "layer_types": 5}, "layer_types=5"),
    ("layer_types_nested", {**QWEN, "layer_types": [[1], [1]]}, "layer_types=[[1], [1]]"),
    ("max_window_layers_str", {**QWEN_WINDOW, "max_window_layers": "x"}, "max_window_layers='x'"),
    ("max_window_layers_bool", {**QWEN_WINDOW, "max_window_layers": True}, "max_window_layers=True (a whole number"),
    ("max_window_layers_null", {**QWEN_WINDOW, "max_window_layers": None}, "max_window_layers=None"),
    ("factor_str", rope(rope_type="linear", factor="x"), "rope_scaling factor='x'"),
    ("factor_nan", rope(rope_type="yarn", factor=float("nan")), "rope_scaling factor=nan"),
    ("factor_inf", rope(rope_type="linear", factor=float("inf")), "rope_scaling factor=inf"),
    ("factor_negative", rope(rope_type="linear", factor=-1), "rope_scaling factor=-1"),
    ("factor_zero", rope(rope_type="llama3", factor=0), "rope_scaling factor=0"),
    ("factor_bool", rope(rope_type="linear", factor=True), "rope_scaling factor=True"),
    ("factor_null_linear", rope(rope_type="linear", factor=None), "rope_scaling factor=None"),
    ("factor_huge_int", rope(rope_type="linear", factor=10**400), "rope_scaling factor=1000"),
    ("dynamic_factor_str", rope(rope_type="dynamic", factor="2"), "rope_scaling factor='2'"),
    ("llama3_low_str", rope(rope_type="llama3", factor=2, low_freq_factor="a"), "low_freq_factor='a'"),
    ("llama3_low_zero", rope(rope_type="llama3", factor=2, low_freq_factor=0), "low_freq_factor=0"),
    ("llama3_low_is_high", rope(rope_type="llama3", factor=2, low_freq_factor=4.0),
     "low_freq_factor and high_freq_factor are both 4.0"),
    ("llama3_original_float", rope(rope_type="llama3", factor=2, original_max_position_embeddings=8192.5),
     "original_max_position_embeddings=8192.5"),
    ("yarn_original_zero", rope(rope_type="yarn", factor=4, original_max_position_embeddings=0),
     "original_max_position_embeddings=0"),
    ("yarn_null_factor_original_zero", rope(rope_type="yarn", factor=None, original_max_position_embeddings=0),
     "original_max_position_embeddings=0"),
    ("yarn_beta_fast_str", rope(rope_type="yarn", factor=4, beta_fast="x"), "beta_fast='x'"),
    ("yarn_beta_slow_negative", rope(rope_type="yarn", factor=4, beta_slow=-1), "beta_slow=-1"),
    ("yarn_attention_factor_zero", rope(rope_type="yarn", factor=4, attention_factor=0.0), "attention_factor=0.0"),
    ("yarn_mscale_all_dim_negative", rope(rope_type="yarn", factor=4, mscale=1.0, mscale_all_dim=-10),
     "mscale_all_dim=-10"),
    ("yarn_truncate_str", rope(rope_type="yarn", factor=4, truncate="x"), "truncate='x'"),
    ("rope_parameters_factor", {**BASE, "rope_parameters": {"rope_type": "linear", "factor": -2.0, "rope_theta": 1e4}},
     "rope_parameters factor=-2.0"),
    ("rope_theta_huge_int", {**BASE, "rope_theta": 10**400}, "rope_theta=1000"),
    ("yarn_rope_theta_one", {**rope(rope_type="yarn", factor=4), "rope_theta": 1.0}, "rope_theta 1.0"),
    ("dynamic_head_dim_2", {**rope(rope_type="dynamic", factor=2), "head_dim": 2}, "head_dim 2"),
    ("use_cache_str", {**BASE, "use_cache": "false"}, "use_cache must be true or false, got 'false'"),
    ("use_cache_null", {**BASE, "use_cache": None}, "use_cache must be true or false, got None"),
    ("tie_str", {**BASE, "tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    ("tie_int", {**BASE, "tie_word_embeddings": 2}, "tie_word_embeddings must be true or false, got 2"),
    ("tie_null", {**BASE, "tie_word_embeddings": None}, "tie_word_embeddings must be true or false, got None"),
    ("attention_bias_str", {**BASE, "attention_bias": "false"}, "attention_bias must be true or false, got 'false'"),
    ("attention_bias_int", {**BASE, "attention_bias": 1}, "attention_bias must be true or false, got 1"),
    ("mlp_bias_int", {**BASE, "mlp_bias": 0}, "mlp_bias must be true or false, got 0"),
    ("use_sliding_window_str", {**QWEN_WINDOW, "use_sliding_window": "false"},
     "use_sliding_window must be true or false, got 'false'"),
    ("router_logits_str", {**MIXTRAL, "output_router_logits": "false"},
     "output_router_logits must be true or false, got 'false'"),
    # the load-balancing loss is multiplied by it: a string crashed the first step, NaN trained to NaN weights
    ("router_coef_str", {**MIXTRAL, "router_aux_loss_coef": "x"}, "router_aux_loss_coef must be a number >= 0, got 'x'"),
    ("router_coef_nan", {**MIXTRAL, "router_aux_loss_coef": float("nan")}, "router_aux_loss_coef must be a number"),
    ("router_coef_inf", {**MIXTRAL, "router_aux_loss_coef": float("inf")}, "router_aux_loss_coef must be a number"),
    ("router_coef_negative", {**MIXTRAL, "router_aux_loss_coef": -0.01}, "got -0.01"),
    ("router_coef_null", {**MIXTRAL, "router_aux_loss_coef": None}, "got None"),
    # finite and of the right sign, but past what float32 computes with (lcft.model.config.REAL_RANGES)
    ("router_coef_huge", {**MIXTRAL, "router_aux_loss_coef": 1e308}, "router_aux_loss_coef=1e+308 is outside 0..9.0072e+15"),
    ("init_range_huge", {**BASE, "initializer_range": 1e308}, "initializer_range=1e+308 is outside 0..1"),
    ("init_range_above_1", {**BASE, "initializer_range": 1.5}, "initializer_range=1.5 is outside 0..1"),
    ("eps_huge", {**BASE, "rms_norm_eps": 1e308}, "rms_norm_eps=1e+308 is outside 1.17549e-38..3.40282e+38"),
    ("eps_tiny", {**BASE, "rms_norm_eps": 1e-300}, "rms_norm_eps=1e-300 is outside 1.17549e-38"),
    # positive, but 1 / rope_theta^(2i/head_dim) or its scaling overflows fp32 (transformers' frequencies too)
    ("rope_theta_tiny", {**BASE, "rope_theta": 1e-300}, "rope_theta=1e-300 gives a RoPE frequency of inf"),
    ("rope_theta_huge", {**BASE, "rope_theta": 1e308}, "rope_theta=1e+308 gives a RoPE frequency of 0.0"),
    ("linear_factor_tiny", rope(rope_type="linear", factor=1e-300),
     "rope_scaling {'rope_type': 'linear', 'factor': 1e-300} (with rope_theta=10000.0) gives a RoPE frequency of inf"),
    ("bos_huge", {**BASE, "bos_token_id": 10**30}, "bos_token_id=1000000000000000000000000000000 is not null or a "
                                                   "whole number"),
    ("pad_negative", {**BASE, "pad_token_id": -17}, "pad_token_id=-17 is outside -16..15"),
    ("pad_vocab_size", {**BASE, "pad_token_id": 16}, "pad_token_id=16 is outside -16..15"),
    ("eos_list", {**BASE, "eos_token_id": [2, 2.5]}, "eos_token_id=[2, 2.5] is not null"),
    ("eos_str", {**BASE, "eos_token_id": "2"}, "eos_token_id='2' is not null"),
    ("bos_bool", {**BASE, "bos_token_id": True}, "bos_token_id=True is not null"),
]
CASE_IDS = [c[0] for c in BAD_CONFIGS]


def folder_with(tmp_path: Path, config: dict, meta: dict | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))  # NaN and Infinity as Python's json writes them
    if meta is not None:
        (folder / "lcft.json").write_text(json.dumps(meta))
    return folder


def plan_error(folder: Path) -> str:
    """`lcft plan --init` (reads the folder's config files only): exit 1 with one `error:` line."""
    r = runner.invoke(app, ["plan", "--init", str(folder), "--seq-len", "1K"])
    assert isinstance(r.exception, SystemExit) and r.exit_code == 1, (r.exception, r.output)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    return lines[0]


@pytest.mark.parametrize("case,config,text", BAD_CONFIGS, ids=CASE_IDS)
def test_bad_config_json_is_one_line(tmp_path, case, config, text):
    folder = folder_with(tmp_path, config)
    with pytest.raises(LcftError) as e:
        read_config(folder)
    msg = str(e.value)
    assert text in msg and "\n" not in msg, msg
    assert text in plan_error(folder)


@pytest.mark.parametrize("value", ["x", [1], None, 7], ids=["string", "list", "null", "number"])
def test_lcft_json_attention_not_an_object_is_one_line(tmp_path, value):
    folder = folder_with(tmp_path, BASE, {"format_version": 1, "attention": value})
    with pytest.raises(LcftError) as e:
        read_config(folder)
    msg = str(e.value)
    assert f"lcft.json: attention is {value!r}" in msg and "\n" not in msg, msg
    assert "lcft.json: attention" in plan_error(folder)


@pytest.mark.parametrize("file, change, says", [
    ("lcft.json", {"attention": "x"}, "{folder}/lcft.json: attention is 'x', not an object"),
    # accepted here once, then refused by the kernels at the first forward of train or eval
    ("lcft.json", {"attention": {"backend": "sparse", "impl": "flash"}},
     "{folder}/lcft.json: bad attention block (impl: 'flash' is not one of auto, reference, cpu, triton"),
    ("lcft.json", {"attention": {"backend": None}}, "bad attention block (backend: None is not one of dense, sparse"),
    # "false" as a string was read as true, which dropped the folder's own lm_head from the export
    ("config.json", {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    # written back unchecked into the export, where transformers cannot build an embedding with that padding row
    ("config.json", {"pad_token_id": 10**30}, "pad_token_id=1000000000000000000000000000000 is not null"),
    # a carried key is written into the export (and every checkpoint): a model folder's config.json is small
    ("config.json", {"blob": "x" * (16 << 20)}, "{folder}/config.json is 167"),
])
def test_export_of_a_folder_with_a_bad_field_is_one_line(tmp_path, file, change, says):
    """The same readers under `lcft export` of a complete folder (weights present)."""
    torch.manual_seed(0)
    folder = save_pretrained(Llama(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=2)), tmp_path / "m")
    data = json.loads((folder / file).read_text())
    (folder / file).write_text(json.dumps({**data, **change}))
    r = runner.invoke(app, ["export", str(folder), "--out", str(tmp_path / "out")])
    assert isinstance(r.exception, SystemExit) and r.exit_code == 1, (r.exception, r.output)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says.format(folder=folder) in lines[0], r.output
    assert not (tmp_path / "out").exists()


def test_a_rope_scaling_flag_meets_the_same_check():
    """--rope-scaling's JSON form reaches the model through LlamaConfig: checked where config.json's is."""
    for text, field in (('{"rope_type": "dynamic", "factor": "2"}', "factor='2'"),
                        ('{"rope_type": "llama3", "factor": 8, "high_freq_factor": 1}', "both 1")):
        with pytest.raises(LcftError, match=field):
            dataclasses.replace(LlamaConfig(), rope_scaling=parse_rope_scaling(text))


def test_a_custom_class_with_a_list_in_auto_map_loads_with_its_note(tmp_path):
    """AutoTokenizer's auto_map entry is a [slow, fast] list (null for a missing one): the note lists the names."""
    d = {**BASE, "architectures": ["FooForCausalLM"],
         "auto_map": {"AutoModelForCausalLM": "modeling_foo.FooForCausalLM", "AutoTokenizer": ["tok.Foo", None]}}
    assert config_notes(d)[0] == ("architectures ['FooForCausalLM'] loaded as LlamaForCausalLM (model_type llama); "
                                  "the model's own code (auto_map ['modeling_foo.FooForCausalLM', 'tok.Foo']) was "
                                  "not run")
    assert config_notes({**d, "auto_map": "x"})[0].endswith("the model's own code was not run")
    r = runner.invoke(app, ["plan", "--init", str(folder_with(tmp_path, d)), "--seq-len", "1K"])
    assert r.exit_code == 0 and "auto_map ['modeling_foo.FooForCausalLM', 'tok.Foo']" in r.output, r.output


@pytest.fixture
def transformers():
    return pytest.importorskip("transformers")


# rope_scaling as published models give it (the v4 `type` key included), with their rope_theta and
# max_position_embeddings; edge values transformers computes with (yarn's factor null, mscale 0 = off, factor < 1).
PUBLISHED_ROPE = {
    "llama-3.1": (5e5, 131072, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "qwen2.5-yarn": (1e6, 131072, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    "deepseek-yarn": (1e4, 163840, {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
    "yarn-null-factor": (1e6, 4096, {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 1024}),
    "yarn-mscale-off": (1e4, 4096, {"rope_type": "yarn", "factor": 2, "mscale": 0, "truncate": False}),
    "linear": (1e4, 4096, {"type": "linear", "factor": 8.0}),
    "linear-below-one": (1e4, 4096, {"rope_type": "linear", "factor": 0.5}),
    "dynamic": (1e4, 4096, {"type": "dynamic", "factor": 2.0}),
}


@pytest.mark.parametrize("name", list(PUBLISHED_ROPE))
def test_published_rope_scalings_load_with_transformers_frequencies(tmp_path, transformers, name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta, max_pos, scaling = PUBLISHED_ROPE[name]
    d = {**BASE, "rope_theta": theta, "max_position_embeddings": max_pos, "rope_scaling": scaling}
    cfg = read_config(folder_with(tmp_path, d))
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    kind = hf_cfg.rope_parameters["rope_type"]
    for seq_len in (None, 3 * max_pos):
        want, want_scale = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu", seq_len=seq_len)
        got, got_scale = rope_frequencies(cfg, seq_len)
        torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
        assert got_scale == pytest.approx(want_scale, rel=1e-12)


# (rope_theta, rope_scaling): the largest and smallest values transformers still computes finite, non-zero fp32
# frequencies for at head_dim 32, and values past them.
ROPE_EDGES = [(1e-30, None), (1e30, None), (1e-300, None), (1e308, None), (1e4, {"rope_type": "linear", "factor": 1e-30}),
              (1e4, {"rope_type": "linear", "factor": 1e-300}), (1e20, {"rope_type": "yarn", "factor": 1e3}),
              (1e38, {"rope_type": "yarn", "factor": 1e3})]  # the last: plain RoPE finite, yarn's zero


@pytest.mark.parametrize("theta,scaling", ROPE_EDGES, ids=[f"{t:g}-{s and s['factor']:g}" if s else f"{t:g}"
                                                           for t, s in ROPE_EDGES])
def test_rope_frequencies_are_refused_exactly_where_transformers_overflows(transformers, theta, scaling):
    """transformers' rotary embedding for the same config is the oracle: where any of its frequencies is infinite
    or zero (or its attention scaling), config.json is one line naming the field; elsewhere lcft's are its own."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d = {**BASE, "rope_theta": theta, "rope_scaling": scaling}
    theirs = LlamaRotaryEmbedding(transformers.LlamaConfig(**{k: v for k, v in d.items() if k != "architectures"}))
    inv_freq, scale = theirs.inv_freq, theirs.attention_scaling
    if bool((inv_freq.isfinite() & (inv_freq != 0)).all()) and scale not in (0, float("inf")):
        got, got_scale = rope_frequencies(config_from_hf(d))
        torch.testing.assert_close(got, inv_freq.float(), rtol=1e-6, atol=0)
        assert got_scale == scale
    else:
        with pytest.raises(LcftError, match="rope_theta=" if scaling is None else "rope_scaling {"):
            config_from_hf(d)


BOOL_KEYS = [("LlamaConfig", BASE, "tie_word_embeddings"), ("LlamaConfig", BASE, "attention_bias"),
             ("LlamaConfig", BASE, "use_cache"), ("Qwen2Config", {**QWEN_WINDOW, "max_window_layers": 0}, "use_sliding_window"),
             ("MixtralConfig", {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"},
              "output_router_logits")]


@pytest.mark.parametrize("cls,base,key", BOOL_KEYS, ids=[k[2] for k in BOOL_KEYS])
def test_boolean_fields_are_read_as_transformers_reads_them(transformers, cls, base, key):
    """true and false load as transformers' class loads them; every value its class refuses, lcft refuses."""
    fields = {k: v for k, v in base.items() if k not in ("architectures", "model_type")}
    for value in (True, False):
        d = {**base, key: value}
        theirs, ours = getattr(transformers, cls)(**{**fields, key: value}), config_from_hf(d)
        if key == "use_sliding_window":
            assert ours.sliding_window == (64 if theirs.layer_types[0] == "sliding_attention" else None)
        else:
            assert getattr(ours, key) is getattr(theirs, key) is value
    for value in ("false", "true", 0, 1, 2, None):
        with pytest.raises(Exception):  # noqa: B017 (transformers' strict dataclass error)
            getattr(transformers, cls)(**{**fields, key: value})
        with pytest.raises(LcftError, match=f"{key} must be true or false, got {value!r}"):
            config_from_hf({**base, key: value})


@pytest.mark.parametrize("d,layers", [
    ({**QWEN, "layer_types": ["full_attention"] * 2}, ["full_attention"] * 2),
    ({**QWEN_WINDOW, "max_window_layers": 0}, ["sliding_attention"] * 2),
    ({**QWEN_WINDOW, "max_window_layers": 2}, ["full_attention"] * 2),
], ids=["layer_types", "window_from_layer_0", "window_from_layer_2"])
def test_qwen_window_fields_of_the_right_type_still_load(transformers, d, layers):
    """The attention kind lcft gives every layer is the one transformers' Qwen2Config gives each."""
    assert transformers.Qwen2Config(**d).layer_types == layers
    want = 64 if layers[0] == "sliding_attention" else None
    assert config_from_hf(d).sliding_window == want


@pytest.mark.parametrize("name", ["metagene-1", "generator-eukaryote-3b-base"])
def test_published_configs_still_load(name):
    path = PUBLISHED / name / "config.json"
    if not path.is_file():
        pytest.skip(f"published files not found at {PUBLISHED}")
    d = json.loads(path.read_text())
    cfg = config_from_hf(d)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.rope_theta) == \
        (d["hidden_size"], d["num_hidden_layers"], d["rope_theta"])


@pytest.mark.parametrize("ids", [{"pad_token_id": -1}, {"pad_token_id": -16}, {"eos_token_id": [2, 16]},
                                 {"bos_token_id": 16, "eos_token_id": 99}], ids=["pad_-1", "pad_-16", "eos_list",
                                                                                 "bos_eos_outside"])
def test_token_ids_transformers_builds_a_model_from_still_load(transformers, ids):
    """What transformers builds a model from (it only warns of a bos/eos id outside the vocabulary; pad_token_id -1
    is the last row, as published configs hold it) lcft loads, and writes back as it read it."""
    fields = {k: v for k, v in BASE.items() if k not in ("architectures", "model_type")}
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**fields, **ids}))
    cfg = config_from_hf({**BASE, **ids})
    assert {k: getattr(cfg, k) for k in ids} == ids


def test_a_pad_id_transformers_cannot_build_with_is_refused(transformers):
    fields = {k: v for k, v in BASE.items() if k not in ("architectures", "model_type")}
    with pytest.raises(AssertionError):  # torch's Embedding: padding_idx must be within num_embeddings
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**fields, "pad_token_id": 16}))
    with pytest.raises(LcftError, match="pad_token_id=16 is outside"):
        config_from_hf({**BASE, "pad_token_id": 16})
