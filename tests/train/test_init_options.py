"""--init with RoPE and attention overrides, a fresh model from a preset, bf16 autocast on CPU, --tensorboard."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.errors import LcftError
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics


def test_init_with_rope_and_sparse_overrides(tmp_path, base_cfg, init_dir):
    """The checkpoint keeps the loaded weights' names/shapes and records the new RoPE and attention."""
    s = train(TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "steps": 1, "rope_theta": 5e5,
                                                         "rope_scaling": "yarn:4:128", "attention": "sparse",
                                                         "block_size": 64, "top_k": 2}))
    hf = json.loads((tmp_path / "run" / "checkpoints" / "step-00000001" / "config.json").read_text())
    assert hf["rope_theta"] == 5e5
    assert hf["rope_scaling"]["rope_type"] == "yarn" and hf["rope_scaling"]["factor"] == 4.0
    assert hf["rope_scaling"]["original_max_position_embeddings"] == 128
    model = from_pretrained(s["checkpoint"])
    assert model.config.attention.backend == "sparse" and model.config.attention.sparse.top_k == 2
    init = from_pretrained(init_dir)
    assert init.config.attention.backend == "dense" and init.config.rope_scaling is None
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in init.state_dict().items()}


def test_fresh_preset_is_seeded(tmp_path, base_cfg):
    """Without --init: the preset, initialised from --seed (two runs start from the same weights)."""
    cfg = {k: v for k, v in base_cfg.items() if k != "init"}
    a = train(TrainConfig(out=str(tmp_path / "a"), **{**cfg, "steps": 1, "lr": 0.0}))
    b = train(TrainConfig(out=str(tmp_path / "b"), **{**cfg, "steps": 1, "lr": 0.0}))
    wa, wb = from_pretrained(a["checkpoint"]), from_pretrained(b["checkpoint"])
    assert wa.config.hidden_size == 256 and wa.config.num_hidden_layers == 4  # the tiny preset
    assert all(torch.equal(x, y) for x, y in zip(wa.state_dict().values(), wb.state_dict().values(), strict=True))
    assert read_metrics(tmp_path / "a")[0]["loss"] == read_metrics(tmp_path / "b")[0]["loss"]


def test_bf16_autocast_on_cpu_then_fp32_in_the_same_process(tmp_path, base_cfg):
    """bf16 mixed precision runs on CPU (weights stay fp32); a following fp32 run is not stuck with bf16."""
    s16 = train(TrainConfig(out=str(tmp_path / "bf16"), **{**base_cfg, "steps": 2, "precision": "bf16"}))
    s32 = train(TrainConfig(out=str(tmp_path / "fp32"), **{**base_cfg, "steps": 2, "precision": "fp32"}))
    assert s16["precision"] == "bf16" and s32["precision"] == "fp32"
    l16, l32 = read_metrics(tmp_path / "bf16")[0]["loss"], read_metrics(tmp_path / "fp32")[0]["loss"]
    assert math.isfinite(l16) and l16 != l32 and abs(l16 - l32) < 0.05  # bf16 rounding, same model and data
    assert next(iter(from_pretrained(s16["checkpoint"]).state_dict().values())).dtype == torch.float32


def test_tensorboard(tmp_path, base_cfg):
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(LcftError, match="needs the tensorboard package"):
            train(TrainConfig(out=str(tmp_path / "tb"), tensorboard=True, **base_cfg))
        assert not (tmp_path / "tb").exists()
    else:
        train(TrainConfig(out=str(tmp_path / "tb"), tensorboard=True, **{**base_cfg, "steps": 2}))
        assert list((tmp_path / "tb" / "tensorboard").rglob("events.out.tfevents.*"))



def test_init_accepts_a_run_folder_and_takes_its_latest_checkpoint(tmp_path, base_cfg):
    """`--init runs/base` (as the README's workflow writes it) continues from that run's latest checkpoint."""
    base = train(TrainConfig(out=str(tmp_path / "base"), **{**base_cfg, "steps": 2, "save_every": 1}))
    latest = Path(base["checkpoint"])
    assert latest.name == "step-00000002"
    via_run = train(TrainConfig(out=str(tmp_path / "a"), **{**base_cfg, "init": str(tmp_path / "base"),
                                                              "steps": 1, "lr": 0.0}))
    via_ckpt = train(TrainConfig(out=str(tmp_path / "b"), **{**base_cfg, "init": str(latest), "steps": 1, "lr": 0.0}))
    assert via_run["loss"] == via_ckpt["loss"]  # same weights loaded: the run folder resolved to step 2
    first = train(TrainConfig(out=str(tmp_path / "c"), **{**base_cfg, "init": str(latest.parent / "step-00000001"),
                                                           "steps": 1, "lr": 0.0}))
    assert first["loss"] != via_run["loss"]  # and not to an older checkpoint
