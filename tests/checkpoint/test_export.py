"""`lcft export`'s size estimate (what it names on a full disk) reads the stored dtype that config.json records:
"dtype" as lcft and transformers 5 write it, "torch_dtype" as earlier transformers did."""

from __future__ import annotations

import json

import pytest
import torch

from lcft.checkpoint.export import export_bytes
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.model import Llama, LlamaConfig


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_export_estimate_scales_from_the_recorded_dtype(tmp_path, key):
    folder = tmp_path / "bf16"
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2)
    save_pretrained(Llama(cfg), folder, dtype=torch.bfloat16)
    config = json.loads((folder / "config.json").read_text())
    config[key] = config.pop("dtype")
    (folder / "config.json").write_text(json.dumps(config))
    stored = (folder / "model.safetensors").stat().st_size
    assert export_bytes(folder, torch.float32) == stored * 2
    assert export_bytes(folder, None) == stored
