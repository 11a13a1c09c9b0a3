"""Continued training of models transformers built: `--init <HF folder>` (bf16 on disk) for a Qwen3 and a Mixtral
(router loss on) trains fp32 weights, then `lcft export`; transformers loads the export as the same class."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.cli.app import app
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, max_position_embeddings=4096)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                         "output_router_logits": True, "sliding_window": None}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_from_a_transformers_folder_then_export(tmp_path, base_cfg, family):
    cfg_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    published = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**SHAPE, **extra))
    published.to(torch.bfloat16).save_pretrained(tmp_path / "hf")  # as checkpoints are mostly published
    s = train(TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "init": str(tmp_path / "hf"), "steps": 2}))
    assert s["step"] == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in read_metrics(tmp_path / "run"))

    r = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "export" / "config.json").read_text())["architectures"] == [model_cls]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    assert type(back).__name__ == model_cls
    ours, init = from_pretrained(s["checkpoint"]).eval(), from_pretrained(tmp_path / "hf")
    assert init.embed_tokens.weight.dtype == torch.bfloat16 and ours.embed_tokens.weight.dtype == torch.float32
    assert not torch.equal(ours.embed_tokens.weight, init.embed_tokens.weight.float())  # it trained, fp32 master
    ids = torch.randint(4, 9, (1, 64))
    with torch.no_grad():
        assert (back(ids).logits - ours(ids)).abs().max().item() < 1e-4
