"""Training or evaluating past the model's declared context (max_position_embeddings): a warning, and the
checkpoints record the new maximum (RoPE frequencies unchanged, so the weights mean the same)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.cli.app import app
from lcft.model import Llama
from lcft.model.rope import rope_frequencies
from lcft.train import TrainConfig, train
from lcft.train.model_setup import declare_context
from tests.train.conftest import small_model_config


@pytest.fixture
def short_init(tmp_path):
    torch.manual_seed(0)
    out = tmp_path / "short"
    save_pretrained(Llama(small_model_config(max_position_embeddings=256)), out)
    return out


def test_training_past_max_positions_warns_and_records_the_new_maximum(tmp_path, base_cfg, short_init, capsys):
    s = train(TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "init": str(short_init), "steps": 1}))
    out = capsys.readouterr().out
    assert "--seq-len 512 is longer than the model's max_position_embeddings 256" in out
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-00000001" / "config.json").read_text())
    assert saved["max_position_embeddings"] == 512 and s["step"] == 1


def test_a_seq_len_not_dividing_the_windows_says_what_is_never_trained_on(tmp_path, base_cfg, capsys):
    """768 of 2048-token windows: two aligned pieces, the last 512 tokens of every window unused (had been
    silent); 512 divides them: no warning."""
    train(TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "seq_len": 768, "steps": 1}))
    assert ("warning: --seq-len 768 takes 2 aligned piece(s) of each 2048-token window; its last 512 tokens are "
            "never trained on") in capsys.readouterr().out
    train(TrainConfig(out=str(tmp_path / "run512"), **{**base_cfg, "steps": 1}))
    assert "never trained on" not in capsys.readouterr().out


@pytest.mark.parametrize("scaling,raised", [
    (None, True), ({"rope_type": "linear", "factor": 2.0}, True),
    ({"rope_type": "yarn", "factor": 4.0}, True), ({"rope_type": "llama3", "factor": 8.0}, True),
    ({"rope_type": "dynamic", "factor": 2.0}, False),
])
def test_raising_the_maximum_changes_no_rope_frequency(scaling, raised):
    cfg = small_model_config(max_position_embeddings=256, rope_scaling=scaling)
    before = rope_frequencies(cfg, 1024)
    warning = declare_context(cfg, 1024)
    assert warning is not None and "256" in warning
    assert cfg.max_position_embeddings == (1024 if raised else 256)
    after = rope_frequencies(cfg, 1024)
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    assert after[1] == before[1]
    assert declare_context(cfg, 128) is None


def test_eval_past_max_positions_warns(tmp_path, data_dir, short_init):
    r = CliRunner().invoke(app, ["eval", "--data", str(data_dir), "--checkpoint", str(short_init),
                                 "--max-windows", "1", "--out", str(tmp_path / "rep"), "--quiet"])
    assert "2048-token contexts are longer than the model's max_position_embeddings 256" in " ".join(r.output.split())
