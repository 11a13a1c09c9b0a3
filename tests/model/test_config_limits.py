"""Counts a config.json declares are bounded before anything is sized from them: each bomb (head_dim 10^9,
10^5 layers, 10^6 experts, a 2^40 vocabulary, 64 layers x 1024 experts, ...) and each bad dimension (zero, negative, a string,
num_key_value_heads 0) is one line naming the field and the limit, from loading and from `lcft plan --init`. The
reals' ranges are where float32 arithmetic (lcft's and transformers') stops giving finite, non-zero results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.model.config import COUNT_LIMITS, MAX_MLPS, REAL_RANGES, check_counts
from lcft.model.layers import RMSNorm
from lcft.model.moe import load_balancing_loss
from lcft.shapes import MAX_BATCH

runner = CliRunner()
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 16, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
MIXTRAL = {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4}
# (case, config.json, field named, text of the limit or the fault)
BOMBS = [
    ("head_dim", {**BASE, "head_dim": 10**9}, "head_dim", f"1..{COUNT_LIMITS['head_dim']}"),
    ("layers", {**BASE, "num_hidden_layers": 10**5}, "num_hidden_layers", "1..1024"),
    ("hidden", {**BASE, "hidden_size": 10**7, "head_dim": 16}, "hidden_size", f"1..{COUNT_LIMITS['hidden_size']}"),
    ("heads", {**BASE, "num_attention_heads": 10**6}, "num_attention_heads", "1..1024"),
    ("intermediate", {**BASE, "intermediate_size": 10**12}, "intermediate_size", "limit"),
    ("vocab", {**BASE, "vocab_size": 2**40}, "vocab_size", f"1..{COUNT_LIMITS['vocab_size']}"),
    ("experts", {**MIXTRAL, "num_local_experts": 10**6}, "num_local_experts", "0..1024"),
    ("experts_per_tok", {**MIXTRAL, "num_experts_per_tok": 10**6}, "num_experts_per_tok", "1..1024"),
    ("layers_x_experts", {**MIXTRAL, "num_hidden_layers": 64, "num_local_experts": 1024, "num_experts_per_tok": 1},
     "64 layers x 1024 experts", f"limit of {MAX_MLPS}"),
    ("derived_head_dim", {**BASE, "hidden_size": 60000, "num_attention_heads": 2, "num_key_value_heads": 1},
     "head_dim", "limit"),
    ("zero_kv", {**BASE, "num_key_value_heads": 0}, "num_key_value_heads", "outside 1.."),
    ("negative", {**BASE, "intermediate_size": -96}, "intermediate_size", "outside 1.."),
    ("zero_layers", {**BASE, "num_hidden_layers": 0}, "num_hidden_layers", "outside 1.."),
    ("string", {**BASE, "hidden_size": "64"}, "hidden_size", "whole number"),
    ("float", {**BASE, "num_hidden_layers": 2.5}, "num_hidden_layers", "whole number"),
    ("bool", {**BASE, "vocab_size": True}, "vocab_size", "whole number"),
    ("theta", {**BASE, "rope_theta": "big"}, "rope_theta", "number"),
    ("eps", {**BASE, "rms_norm_eps": -1.0}, "rms_norm_eps", "positive number"),
]


def write(tmp_path: Path, d: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(d))
    return folder


@pytest.mark.parametrize("case,d,name,limit", BOMBS, ids=[b[0] for b in BOMBS])
def test_bomb_is_one_line_before_any_weight(tmp_path, case, d, name, limit):
    folder = write(tmp_path, d)  # no weights at all: the error must come from the config alone
    with pytest.raises(LcftError) as e:
        from_pretrained(folder)
    msg = str(e.value)
    assert name in msg and limit in msg and "\n" not in msg, msg
    assert "weight" not in msg  # refused on the count, not on the missing weights it would otherwise look for


@pytest.mark.parametrize("case", ["head_dim", "zero_kv", "negative", "string", "zero_layers", "layers_x_experts"])
def test_plan_refuses_bad_dimensions_in_one_line(tmp_path, case):
    _, d, name, limit = next(b for b in BOMBS if b[0] == case)
    r = runner.invoke(app, ["plan", "--init", str(write(tmp_path, d)), "--seq-len", "4096"])
    lines = r.output.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1 and name in lines[0] and limit in lines[0], r.output
    assert "fits" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)


def test_the_limits_admit_the_largest_published_shapes(tmp_path):
    """Llama-3.1-405B's widths and a 256-expert count pass the limits (configs only: nothing is built)."""
    from lcft.model.hf import config_from_hf

    big = config_from_hf({**BASE, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
                          "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256})
    assert big.head_dim == 128
    moe = config_from_hf({**MIXTRAL, "num_local_experts": 256, "num_experts_per_tok": 8, "vocab_size": 262144})
    assert moe.num_local_experts == 256
    for layers, experts in ((56, 8), (61, 256)):  # Mixtral 8x22B; DeepSeek-V3's counts: under the MLP limit
        assert config_from_hf({**MIXTRAL, "num_hidden_layers": layers, "num_local_experts": experts}).num_hidden_layers


def test_the_router_coefficient_limit_is_where_the_float32_loss_overflows():
    """At its worst, a router collapsed onto one expert (the loss at its largest, num_local_experts) over the most
    tokens a micro-batch holds, the limit times the loss times the tokens (lcft.train.step) is finite in float32;
    twice the limit is inf. transformers' Mixtral loss with a coefficient of 1e308 is inf on any batch."""
    transformers = pytest.importorskip("transformers")
    experts = COUNT_LIMITS["num_local_experts"]
    stats = torch.zeros(2, experts)
    stats[:, 0] = 7.0  # 7 rows: every probability and every choice on expert 0
    aux = load_balancing_loss(stats, 7, experts)
    assert aux.item() == experts
    tokens = torch.tensor(float(MAX_BATCH * COUNT_LIMITS["max_position_embeddings"]))
    limit = REAL_RANGES["router_aux_loss_coef"][1]
    assert torch.isfinite(limit * aux * tokens) and torch.isinf(2 * limit * aux * tokens)
    cfg = transformers.MixtralConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                     output_router_logits=True, router_aux_loss_coef=1e308)
    ids = torch.arange(8)[None] % 16
    assert torch.isinf(transformers.MixtralForCausalLM(cfg)(ids, labels=ids).loss)


@pytest.mark.parametrize("eps", [1e-300, REAL_RANGES["rms_norm_eps"][0], REAL_RANGES["rms_norm_eps"][1], 1e308])
def test_the_norm_epsilon_range_is_where_the_norm_stays_finite_and_non_zero(eps):
    """lcft's RMSNorm and transformers' give the same rows; within the range a row of zeros stays 0 and a row of
    ones non-zero, below it the zero row is NaN (0 x inf), above it every row is 0."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.stack([torch.zeros(8), torch.ones(8)])  # (2, 8)
    ours, theirs = RMSNorm(8, eps)(x).detach(), LlamaRMSNorm(8, eps)(x).detach()
    assert torch.equal(ours.isnan(), theirs.isnan()) and torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    low, high = REAL_RANGES["rms_norm_eps"]
    inside = low <= eps <= high
    assert inside == bool(ours[0].isfinite().all() and (ours[1] != 0).all()), ours


def test_the_initializer_range_limit_is_transformers_llama_limit():
    """transformers' LlamaConfig refuses initializer_range above 1 (a config.json lcft writes back would not load);
    at 1 a fresh model's float32 weights are finite."""
    transformers = pytest.importorskip("transformers")
    high = REAL_RANGES["initializer_range"][1]
    transformers.LlamaConfig(initializer_range=high)
    with pytest.raises(Exception, match="initializer_range"):  # noqa: B017 (transformers' strict dataclass error)
        transformers.LlamaConfig(initializer_range=high * 1.5)


def test_an_initializer_range_of_0_loads_as_in_transformers(tmp_path):
    """transformers takes initializer_range 0 (its interval starts at 0) and it only sizes a fresh model's weights,
    never a loaded checkpoint's: a published config.json holding it loads; a negative one is refused."""
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(initializer_range=0.0)
    check_counts({"initializer_range": 0.0})
    with pytest.raises(LcftError, match="initializer_range must be a number >= 0"):
        check_counts({"initializer_range": -0.01})


def test_a_model_type_lcft_has_no_family_for_is_the_one_choice_check():
    """model_type goes through lcft.config.check_choice, as every choice does: the field, the families and the
    close match (a LlamaConfig built in Python or from a file)."""
    from lcft.config import ConfigError
    from lcft.model.config import LlamaConfig

    with pytest.raises(ConfigError) as e:
        LlamaConfig(model_type="mistrall", vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    assert str(e.value) == ("model_type: 'mistrall' is not one of llama, mistral, qwen2, qwen3, mixtral "
                            "(did you mean 'mistral'?)")
