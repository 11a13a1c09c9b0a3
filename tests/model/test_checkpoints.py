"""Weights as published checkpoints ship them: sharded safetensors with an index, bf16/fp16 on disk, loaded
tensor by tensor (peak about one model copy), exported sharded; and one-line errors for what lcft cannot load."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.model import Llama, LlamaConfig
from lcft.model.hf import config_to_hf
from lcft.model.hf_params import to_hf_name

transformers = pytest.importorskip("transformers")

QWEN3 = dict(vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24)


def hf_qwen3(folder, dtype=torch.float32, **save_kw):
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3)).to(dtype)
    model.save_pretrained(folder, **save_kw)
    return model


def test_sharded_bf16_checkpoint_from_transformers_loads_as_stored(tmp_path):
    theirs = hf_qwen3(tmp_path / "hf", torch.bfloat16, max_shard_size="30KB")
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 2
    ours = from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == "qwen3" and ours.config.head_dim == 24 and ours.config.qk_norm
    state = theirs.state_dict()
    for name, p in ours.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, state[to_hf_name(name)]), name


def test_export_is_sharded_above_the_limit_and_loads_in_transformers(tmp_path):
    hf_qwen3(tmp_path / "hf", torch.float16)
    ours = from_pretrained(tmp_path / "hf")
    assert ours.embed_tokens.weight.dtype == torch.float16
    save_pretrained(ours, tmp_path / "out", max_shard_size=40_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert not (tmp_path / "out" / "model.safetensors").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(back).__name__ == "Qwen3ForCausalLM"
    state = back.state_dict()
    assert all(torch.equal(p, state[to_hf_name(n)]) for n, p in ours.named_parameters())

    save_pretrained(ours, tmp_path / "out")  # one file now: the earlier shards and index are gone
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "lcft.json", "model.safetensors"]


PEAK_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    from lcft.checkpoint.hf_folder import from_pretrained
    torch.ones(1) + 1  # warm up the allocator and torch's lazy state before the baseline
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = from_pretrained(sys.argv[1])
    total = sum(float(p.sum()) for p in model.parameters())  # every page read, wherever the tensors live
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    print(after - before, size)
""")


def test_loading_a_sharded_checkpoint_peaks_at_about_one_model_copy(tmp_path):
    """~100 MB of fp32 weights in 8 MB shards: the load raises the peak RSS by < 1.25x the model's bytes (a
    state dict read whole and then copied into the model would take 2x)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8)
    save_pretrained(Llama(cfg), tmp_path / "big", max_shard_size=8 << 20)
    assert len(list((tmp_path / "big").glob("model-*.safetensors"))) >= 10
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path / "big")], capture_output=True,
                         text=True, check=True).stdout.split()
    grown, size = int(out[0]), int(out[1])
    assert size > 100e6 and grown < 1.25 * size, (grown / size)


def ok_folder(tmp_path):
    hf_qwen3(tmp_path / "ok")
    return tmp_path / "ok", json.loads((tmp_path / "ok" / "config.json").read_text())


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
    ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}}, "'longrope'"),
    ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8}, "layer_types"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1, "layer_types": None},
     "max_window_layers=1"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"num_attention_heads": None}, "num_attention_heads"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quantization_config \\(quant_method 'gptq'"),
])
def test_unsupported_config_is_a_one_line_error_naming_the_field(tmp_path, change, message):
    folder, cfg = ok_folder(tmp_path)
    cfg = {k: v for k, v in {**cfg, **change}.items() if v is not None or k not in ("num_attention_heads",)}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LcftError, match=message) as e:
        from_pretrained(folder)
    assert "\n" not in str(e.value)


def test_mixtral_router_jitter_is_refused(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(**{**QWEN3, "num_local_experts": 2}, router_jitter_noise=0.1)
    transformers.MixtralForCausalLM(cfg).save_pretrained(tmp_path / "m")
    with pytest.raises(LcftError, match="router_jitter_noise=0.1"):
        from_pretrained(tmp_path / "m")


def test_missing_shard_and_shape_mismatch_name_the_file(tmp_path):
    hf_qwen3(tmp_path / "hf", max_shard_size="30KB")
    shard = sorted((tmp_path / "hf").glob("model-*.safetensors"))[1]
    tensors = load_file(shard)
    shard.unlink()
    with pytest.raises(LcftError, match=f"shard\\(s\\) missing: {shard.name}"):
        from_pretrained(tmp_path / "hf")
    key = next(iter(tensors))
    save_file({**tensors, key: torch.zeros(3, 5)}, str(shard))
    with pytest.raises(LcftError, match=f"{shard.name}: weight {key} has shape \\(3, 5\\)"):
        from_pretrained(tmp_path / "hf")


def test_export_cli_bad_architecture_is_one_line_and_nothing_written(tmp_path):
    folder, cfg = ok_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["FalconForCausalLM"]}))
    r = CliRunner().invoke(app, ["export", str(folder), "--out", str(tmp_path / "out")])
    assert r.exit_code != 0 and "architectures" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_variant_the_class_cannot_express_is_refused_on_export():
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, sliding_window=8)
    with pytest.raises(LcftError, match="LlamaForCausalLM cannot express sliding_window=8"):
        config_to_hf(cfg)
    assert config_to_hf(LlamaConfig(**{**cfg.__dict__, "model_type": "mistral"}))["sliding_window"] == 8


@pytest.mark.parametrize("dtype, code", [(torch.int64, "I64"), (torch.bool, "BOOL"), (torch.uint8, "U8"),
                                         (torch.float8_e4m3fn, "F8_E4M3"), (torch.float8_e5m2, "F8_E5M2")])
def test_a_weight_of_a_dtype_lcft_does_not_read_is_refused(tmp_path, dtype, code):
    """An integer, bool or FP8 tensor where a weight belongs was cast as it was read: train and eval ran on it (an
    FP8 checkpoint's values without the scales it keeps beside them), and `lcft export` wrote FP8 weights under a
    config.json transformers cannot load. Refused by the dtype the header declares, before any tensor is read, in
    one line naming the file, the tensor, its dtype and the dtypes lcft reads (safetensors' own codes, as the
    header holds them, are the oracle)."""
    hf_qwen3(tmp_path / "hf")
    f = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(f)
    key = sorted(tensors)[1]
    save_file({**tensors, key: torch.ones(tensors[key].shape).to(dtype)}, str(f))
    said = (f"{f}: weight '{key}' is stored as '{code}'; lcft reads weights stored as F32, BF16, F16, F64 "
            "(float32, bfloat16, float16, float64)")
    with pytest.raises(LcftError) as e:
        from_pretrained(tmp_path / "hf")
    assert str(e.value) == said
    hf_qwen3(tmp_path / "other")
    assert CliRunner().invoke(app, ["export", str(tmp_path / "other"), "--out", str(tmp_path / "old")]).exit_code == 0
    for out in (tmp_path / "new", tmp_path / "old"):  # new; holding an export (the source's dtype asked first)
        r = CliRunner().invoke(app, ["export", str(tmp_path / "hf"), "--out", str(out)])
        assert r.exit_code == 1 and "".join(r.output.split()) == "".join(f"error: {said}".split()), r.output


@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_weights_read_from_a_file_start_where_torch_allocates(tmp_path, dtype):
    """safetensors hands tensors out 8 bytes past a 64-byte boundary; CPU matmuls round differently on such
    operands, so a model read from its checkpoint has to sit on the boundary, as one built in memory (or cast
    from bf16 as read) does: else a resumed run drifts from the run that never stopped."""
    torch.manual_seed(0)
    save_pretrained(Llama(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)), tmp_path / "m")
    for name, p in from_pretrained(tmp_path / "m", dtype=dtype).named_parameters():
        assert p.data_ptr() % 64 == 0, name


@pytest.mark.parametrize("rest, q_proj", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                          (torch.float16, torch.bfloat16)])
def test_weights_of_several_dtypes_export_in_one_holding_them_all(tmp_path, rest, q_proj):
    """A folder of q_proj weights in one dtype beside the rest in another is exported in one dtype, the narrowest
    holding every stored value exactly (torch.promote_types), and config.json names it: transformers loads every
    weight in config.json's dtype, so an export stored as read (mixed, under the dtype of the first weight) loaded
    a float32 q_proj beside bfloat16 weights truncated to bfloat16. Oracle: the source's own tensors as the
    safetensors library reads them, each cast to that dtype (exact), against what transformers loads of the
    export; and, where the source's config.json already names that dtype, transformers' own load of the source."""
    hf_qwen3(tmp_path / "hf", rest)  # config.json names `rest`; the weights cast from float32 values, each dtype's
    f = tmp_path / "hf" / "model.safetensors"  # own (a float32 q_proj holds what bfloat16 cannot)
    torch.manual_seed(1)
    values = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3)).state_dict()
    source = {k: values[k].to(q_proj if "q_proj" in k else rest) for k in load_file(f)}
    save_file(source, str(f), metadata={"format": "pt"})
    r = CliRunner().invoke(app, ["export", str(tmp_path / "hf"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    widest = torch.promote_types(rest, q_proj)
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert {t.dtype for t in exported.values()} == {widest}
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == str(widest)[6:]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(theirs[k], t.to(widest)) for k, t in source.items()), "values changed"
    if widest == rest:  # the source's config.json names the dtype: transformers reads it as the export holds it
        direct = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
        assert all(torch.equal(direct[k], theirs[k]) for k in source)
