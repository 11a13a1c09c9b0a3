"""AttentionConfig holds backend, impl and one SparseSpec; lcft.json keeps a flat attention object, old ones load."""

from __future__ import annotations

import json

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained, read_config, save_pretrained
from lcft.errors import LcftError
from lcft.kernels.spec import SparseSpec
from lcft.model import AttentionConfig, Llama, LlamaConfig

# The attention object as checkpoints wrote it before the selector existed.
OLD_FORMAT = {"backend": "sparse", "block_size": 32, "top_k": 4, "local_blocks": 2, "sink_blocks": 0, "impl": "cpu"}


def _small(attention: AttentionConfig) -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                             num_key_value_heads=2, attention=attention))


def test_old_checkpoint_attention_object_still_loads(tmp_path):
    save_pretrained(_small(AttentionConfig()), tmp_path / "ckpt")
    extra_path = tmp_path / "ckpt" / "lcft.json"
    extra = json.loads(extra_path.read_text())
    extra["attention"] = OLD_FORMAT
    extra_path.write_text(json.dumps(extra))
    model = from_pretrained(tmp_path / "ckpt")
    want = SparseSpec(block_size=32, top_k=4, local_blocks=2, sink_blocks=0, selector="block_mean")
    assert model.config.attention == AttentionConfig(backend="sparse", sparse=want, impl="cpu")
    assert model.layers[0].attn.core.spec == want


def test_saved_attention_object_is_flat_and_reads_back(tmp_path):
    attention = AttentionConfig(backend="sparse", sparse=SparseSpec(block_size=16, top_k=2), impl="cpu")
    save_pretrained(_small(attention), tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "lcft.json").read_text())["attention"]
    assert saved == {"backend": "sparse", "impl": "cpu", "block_size": 16, "top_k": 2, "local_blocks": 1,
                     "sink_blocks": 1, "selector": "block_mean"}
    assert read_config(tmp_path / "ckpt").attention == attention
    assert LlamaConfig(attention=saved).attention == attention  # a dict given to LlamaConfig reads the same way


def test_bad_attention_objects_are_clear_errors(tmp_path):
    save_pretrained(_small(AttentionConfig()), tmp_path / "ckpt")
    extra_path = tmp_path / "ckpt" / "lcft.json"
    extra = json.loads(extra_path.read_text())
    extra["attention"] = dict(OLD_FORMAT, window=3)
    extra_path.write_text(json.dumps(extra))
    with pytest.raises(LcftError, match="bad attention block"):
        read_config(tmp_path / "ckpt")
    with pytest.raises(LcftError, match="top_k must be a whole number from 0"):
        AttentionConfig.from_dict(dict(OLD_FORMAT, top_k=-1))
