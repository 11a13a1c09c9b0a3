"""Trainer test fixtures: small prepared windows from the bundled human sample, and a model smaller than tiny."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.genomics import prepare_windows, sample_fasta
from lcft.model import Llama, LlamaConfig
from lcft.train import TrainConfig, train

WINDOW = 2048  # prepared window length; tests train on 512-token aligned sub-windows of it
SEQ = 512


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Windows of 2048 tokens from the bundled sample (hg38 chr2 start: real soft-masking and an N telomere)."""
    out = tmp_path_factory.mktemp("train-data") / "windows"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=WINDOW, train=("chr2",), eval=("chr22",))
    return out


def small_model_config(**changes: Any) -> LlamaConfig:
    """hidden 64, 2 blocks: a few ms per 512-token step, so trainer tests are about the trainer."""
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, rope_theta=1e6, **changes)


@pytest.fixture(scope="session")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh small model saved in HF layout (the trainer's --init)."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("train-init") / "model"
    save_pretrained(Llama(small_model_config()), out)
    return out


def _base(data_dir: Path, init_dir: Path) -> dict[str, Any]:
    return dict(data=str(data_dir), init=str(init_dir), seq_len=SEQ, steps=6, global_batch=2, micro_batch=1,
                warmup=2, lr=1e-3, precision="fp32", save_every=0, progress=False)


@pytest.fixture
def base_cfg(data_dir: Path, init_dir: Path) -> dict[str, Any]:
    """TrainConfig fields shared by the tests (fp32, no live view); tests add out= and their own changes."""
    return _base(data_dir, init_dir)


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, init_dir: Path) -> Path:
    """The base run in this process, a checkpoint every 2 steps (all kept): the losses and weights a launch of the
    same run reaches uninterrupted (two processes of one micro-batch each compute what one process does)."""
    out = tmp_path_factory.mktemp("one-process") / "run"
    train(TrainConfig(out=str(out), **{**_base(data_dir, init_dir), "save_every": 2, "keep_last": 0}))
    return out


