"""Failures of a sharded (DCP) save or load are one line: a full disk during the shard writes (ENOSPC injected on
rank 1, and a real small tmpfs during an fsdp run when root) names the folder and the space needed, removes the
temp folder and keeps the last good checkpoint; damaged shards without checksums.json are one line on eval,
export and --init (torch's CheckpointException derives from BaseException: nothing may let it through)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

from lcft.checkpoint.layout import CHECKSUMS, list_checkpoints, verify_checkpoint
from lcft.checkpoint.save import write_checksums
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.launch import run as launch
from lcft.train import TrainConfig, train
from tests.checkpoint.test_dcp_metadata import _cli
from tests.checkpoint.workers import save_with_full_disk
from tests.parallel.harness import run_ranks
from tests.train.test_faults_folders import tmpfs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _left(run: Path) -> list[str]:
    return [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_full_disk_on_one_rank_during_a_sharded_save_is_one_line(tmp_path):
    run = tmp_path / "run"
    results = run_ranks(save_with_full_disk, 2, str(run))
    for r in results:
        assert r["type"] == "LcftError" and "\n" not in r["msg"], r
        assert "no space left" in r["msg"] and "needs about" in r["msg"] and str(run / "checkpoints") in r["msg"]
    assert "step-00000001 is kept" in results[0]["msg"]
    assert [s for s, _ in list_checkpoints(run)] == [1] and not _left(run)
    assert verify_checkpoint(run / "checkpoints" / "step-00000001")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_real_full_disk_during_an_fsdp_save(tmp_path, sharded_run, capfd):
    """A 2 MB tmpfs holds one sharded checkpoint of this model (about 1.3 MB), not two. The launch raises rank
    0's error, one line; no rank shows DCP's CheckpointException."""
    _, cfg = sharded_run
    with tmpfs(tmp_path / "small", "2000k") as small:
        run = small / "run"
        with pytest.raises(LcftError) as e:
            launch("train", TrainConfig(**{**cfg, "out": str(run), "nproc": 2, "shard": "fsdp"}))
        out = capfd.readouterr()
        said = str(e.value)
        assert "cannot save step 2" in said and "no space left" in said and "needs about" in said, (said, out)
        assert "step-00000001 is kept" in said and "\n" not in said
        assert "CheckpointException" not in out.out + out.err
        assert [s for s, _ in list_checkpoints(run)] == [1] and not _left(run)
        assert verify_checkpoint(run / "checkpoints" / "step-00000001")


@pytest.mark.parametrize("entry", ["export", "eval", "init"])
def test_damaged_shards_without_checksums_are_one_line(ckpt, sharded_run, tmp_path, data_dir, entry):
    """A checkpoint copied out of its run without checksums.json (in its run beside checksummed ones it would be
    refused as incomplete first), a shard torn: one line naming it."""
    (ckpt / CHECKSUMS).unlink()
    ckpt = Path(shutil.move(ckpt, tmp_path / "copied"))
    shard = ckpt / "dcp" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:4096])  # torn inside the model weights
    _, cfg = sharded_run
    call = {
        "export": lambda: _cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]),
        "eval": lambda: evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt),), max_windows=1,
                                            out=str(tmp_path / "eval"))),
        "init": lambda: train(TrainConfig(**{**cfg, "init": str(ckpt), "steps": 1, "out": str(tmp_path / "i")})),
    }[entry]
    with pytest.raises(LcftError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and str(ckpt) in msg and "unreadable" in msg, msg


def _poisoned(ckpt: Path, tmp_path: Path, at: int = 0) -> str:
    """The checkpoint's DCP state rewritten (torch's own converters, one shard file: a sharded checkpoint loads on
    any layout) with one first-moment value NaN, its checksums agreeing: a value AdamW never writes. Returns
    the parameter's name."""
    whole, dcp_dir = tmp_path / "whole.pt", ckpt / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "torch.distributed is disabled ... a single process"
        dcp_to_torch_save(dcp_dir, whole)
        state = torch.load(whole, weights_only=True)
        name, moments = next(iter(state["optim"]["state"].items()))
        moments["exp_avg"].view(-1)[at] = float("nan")  # 0: in rank 0's shard of 2, -1: in rank 1's
        torch.save(state, whole)
        groups = (dcp_dir / "param_groups.json").read_bytes()
        shutil.rmtree(dcp_dir)
        torch_save_to_dcp(whole, dcp_dir)
    (dcp_dir / "param_groups.json").write_bytes(groups)
    write_checksums(ckpt)
    return name


@pytest.mark.parametrize("layout, at, says", [("one process", 0, "exp_avg of"),
                                               ("fsdp on 2", 0, "exp_avg of"),
                                               ("fsdp on 2", -1, "on rank 1 holds a non-finite")])
def test_a_non_finite_moment_in_sharded_optimizer_state_is_one_line(ckpt, sharded_run, tmp_path, layout, at, says,
                                                                    capfd):
    """Checked after DCP loads it into each rank's shards, agreed over the ranks: every rank stops with the
    checkpoint named, none trains on (loaded, every later update was non-finite and skipped); rank 0 says which
    rank found it when it holds none of the damaged values itself, and a launch raises rank 0's error. It names the
    parameter as DCP keys it."""
    name = _poisoned(ckpt, tmp_path, at)
    _, cfg = sharded_run
    resumed = TrainConfig(**{**cfg, "resume": str(ckpt), "steps": 3, "out": str(ckpt.parent.parent)})
    with pytest.raises(LcftError) as e:
        if layout == "one process":
            train(resumed)
        else:
            launch("train", dataclasses.replace(resumed, nproc=2, shard="fsdp"))
    out = capfd.readouterr()
    said = str(e.value)
    assert "corrupt optimizer state" in said and str(ckpt / "dcp") in said, (said, out)
    assert says in said and "Traceback" not in out.out + out.err, said
    assert f" of {name} " in said, (name, said)
    assert not (ckpt.parent / "step-00000003").exists()
