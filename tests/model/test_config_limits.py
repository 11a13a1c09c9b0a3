"""Counts a config.json declares are bounded before anything is sized from them: each bomb (head_dim 10^9,
10^5 layers, 10^6 experts, a 2^40 vocabulary, 64 layers x 1024 experts, ...) and each bad dimension (zero, negative, a string,
num_key_value_heads 0) is one line naming the field and the limit, from loading and from `lcft plan --init`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.model.config import COUNT_LIMITS, MAX_MLPS

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
