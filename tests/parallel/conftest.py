"""Fixtures of the context-parallel trainer tests: windows from the bundled sample and a small saved model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.genomics import prepare_windows, sample_fasta
from lcft.kernels.spec import SparseSpec
from lcft.model import AttentionConfig, Llama, LlamaConfig


@pytest.fixture(scope="session")
def cp_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2048-token windows of the bundled human sample (train chr2, eval chr22)."""
    out = tmp_path_factory.mktemp("cp-data") / "windows"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=2048, train=("chr2",), eval=("chr22",))
    return out


@pytest.fixture(scope="session")
def cp_init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model with sparse attention in blocks of 16, so 512-token sequences are really sparse."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rope_theta=1e6,
                      attention=AttentionConfig(backend="sparse", impl="cpu", sparse=SparseSpec(
                          block_size=16, top_k=2, local_blocks=1, sink_blocks=1)))
    out = tmp_path_factory.mktemp("cp-init") / "model"
    save_pretrained(Llama(cfg), out)
    return out
