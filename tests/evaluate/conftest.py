"""Fixtures for eval tests: windows prepared from the bundled human sample, and small saved models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.genomics import prepare_windows, sample_fasta
from lcft.model import Llama, LlamaConfig

WINDOW = 2048


def small_config(**over) -> LlamaConfig:
    """A model small enough that an eval over a few 2K windows takes well under a second (GQA, untied)."""
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rope_theta=1e6)
    return LlamaConfig(**{**base, **over})


def save_model(path: Path, seed: int, **over) -> Path:
    torch.manual_seed(seed)
    model = Llama(small_config(**over))
    with torch.no_grad():  # larger than the 0.02 init so the losses differ clearly between models
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(5.0)
    save_pretrained(model, path)
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """2K-token windows: train = chr2 piece, eval = chr22 piece (windows with up to 60% N kept, so the
    edges of its 100 kb N gap are in the split)."""
    out = tmp_path_factory.mktemp("data") / "sample-2k"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=WINDOW, train=("chr2",), eval=("chr22",),
                    max_n_frac=0.6)
    return out


@pytest.fixture(scope="session")
def ckpt_a(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("ck") / "model-a", seed=1)


@pytest.fixture(scope="session")
def ckpt_b(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("ck") / "model-b", seed=2)
