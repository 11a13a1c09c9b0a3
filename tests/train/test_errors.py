"""Bad input: each is a clear LcftError naming the problem, a non-zero CLI exit, and nothing lost or
half-written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.cli.app import app
from lcft.config import ConfigError
from lcft.errors import LcftError
from lcft.model import Llama
from lcft.train import TrainConfig, TrainHooks, latest_checkpoint, train
from lcft.train.metrics import read_metrics

from .conftest import small_model_config


def _fails(tmp_path: Path, base: dict, match: str, hooks: TrainHooks | None = None, **changes) -> Path:
    out = tmp_path / "run"
    with pytest.raises(LcftError, match=match):
        train(TrainConfig(out=str(out), **{**base, **changes}), hooks)
    return out


def test_missing_data(tmp_path, base_cfg):
    out = _fails(tmp_path, base_cfg, "windows folder not found", data=str(tmp_path / "nope"))
    assert not out.exists()


def test_corrupt_data(tmp_path, base_cfg, data_dir):
    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    raw = bytearray((bad / "train.bin").read_bytes())
    raw[1000] ^= 1
    (bad / "train.bin").write_bytes(bytes(raw))
    out = _fails(tmp_path, base_cfg, r"train\.bin is corrupt", data=str(bad))
    assert not out.exists()


def test_seq_len_longer_than_windows(tmp_path, base_cfg):
    out = _fails(tmp_path, base_cfg, "longer than the data's windows", seq_len=4096)
    assert not out.exists()


def test_seq_len_not_multiple_of_sparse_block(tmp_path, base_cfg):
    out = _fails(tmp_path, base_cfg, "not a multiple of the sparse attention block", attention="sparse",
                 seq_len=500, block_size=64)
    assert not out.exists()


def test_out_holds_another_run(tmp_path, base_cfg):
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 2}))
    before = (run / "metrics.jsonl").read_text()
    _fails(tmp_path, base_cfg, r"different config \(steps: 2 -> 6\)")
    _fails(tmp_path, base_cfg, "already holds checkpoints", steps=2)  # same config: continue with --resume
    assert (run / "metrics.jsonl").read_text() == before and latest_checkpoint(run).name == "step-00000002"


def test_init_missing_weights(tmp_path, base_cfg, init_dir):
    bad = tmp_path / "init"
    shutil.copytree(init_dir, bad)
    (bad / "model.safetensors").unlink()
    _fails(tmp_path, base_cfg, "no model.safetensors", init=str(bad))
    _fails(tmp_path, base_cfg, "checkpoint not found", init=str(tmp_path / "nope"))


def test_init_with_a_generation_config_that_is_no_json_object(tmp_path, base_cfg, init_dir):
    """The --init folder's generation_config.json, which every checkpoint would carry: not a JSON object is one
    line naming it, before any checkpoint is written."""
    bad = tmp_path / "init"
    shutil.copytree(init_dir, bad)
    (bad / "generation_config.json").write_text('["max_length", 4096]')
    out = _fails(tmp_path, base_cfg, "generation_config.json: not a JSON object", init=str(bad))
    assert not out.exists()


def test_init_with_a_smaller_vocabulary(tmp_path, base_cfg):
    """An embedding of fewer rows than the data's ids is refused; one of more rows recording the data's tokenizer
    (lcft.json: char) is a padded one and trains."""
    other = tmp_path / "vocab8"
    save_pretrained(Llama(small_model_config(vocab_size=8)), other)
    out = _fails(tmp_path, base_cfg, "vocab_size 8 differs from the data tokenizer's 16", init=str(other))
    assert not out.exists()
    save_pretrained(Llama(small_model_config(vocab_size=32)), tmp_path / "vocab32")
    s = train(TrainConfig(out=str(tmp_path / "padded"), **{**base_cfg, "init": str(tmp_path / "vocab32"), "steps": 1}))
    assert s["step"] == 1


def test_resume_without_checkpoint(tmp_path, base_cfg):
    _fails(tmp_path, base_cfg, "no checkpoint in", resume="auto")
    _fails(tmp_path, base_cfg, "not a checkpoint folder", resume=str(tmp_path))


def test_batch_and_parallel_shapes(tmp_path, base_cfg):
    with pytest.raises(ConfigError, match="not a multiple of micro_batch"):
        TrainConfig(**{**base_cfg, "global_batch": 3, "micro_batch": 2})
    _fails(tmp_path, base_cfg, "cannot be split into context-parallel groups", cp=2)


def test_out_of_memory_is_explained_and_loses_nothing(tmp_path, base_cfg):
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), stop_after=2, **base_cfg))

    def oom(step: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    _fails(tmp_path, base_cfg, r"out of memory at --seq-len 512 x --micro-batch 1, precision fp32; options that "
           r"reduce memory: --checkpointing block, --attention sparse", TrainHooks(before_step=oom), resume="auto")
    assert latest_checkpoint(run).name == "step-00000002"
    assert [r["step"] for r in read_metrics(run)] == [1, 2]


def test_no_memory_for_the_model_itself_is_one_line(tmp_path, base_cfg, monkeypatch):
    """The CPU allocator failing while the model is built (a preset on a small machine; a vocabulary of
    millions): one line naming what was built, not torch's RuntimeError. The allocator's failure is injected."""
    import lcft.train.model_setup as model_setup

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(model_setup, "Llama", no_memory)
    monkeypatch.setattr(model_setup, "load", no_memory)
    _fails(tmp_path, {**base_cfg, "init": ""}, r"^not enough memory to build the model \(preset 'tiny', a vocabulary "
           r"of 16\); `lcft plan` with the same options shows what it needs$")
    _fails(tmp_path, base_cfg, r"^not enough memory to build the model \(from .*init.*, a vocabulary of 16\)")


def test_cli_one_line_error_and_exit_code(tmp_path):
    result = CliRunner().invoke(app, ["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "windows folder not found" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["train", "--data", "x", "--out", "y", "--lr", "fast"])
    assert result.exit_code == 1 and "lr: not a number" in result.output
