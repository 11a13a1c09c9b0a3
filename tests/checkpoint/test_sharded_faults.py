"""Failures of a sharded (DCP) save or load are one line: a full disk during the shard writes (ENOSPC injected on
rank 1, and a real small tmpfs during an fsdp run when root) names the folder and the space needed, removes the
temp folder and keeps the last good checkpoint; damaged shards without checksums.json are one line on eval,
export and --init (torch's CheckpointException derives from BaseException: nothing may let it through)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lcft.checkpoint.layout import CHECKSUMS, list_checkpoints, verify_checkpoint
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
    """A 2 MB tmpfs holds one sharded checkpoint of this model (about 1.3 MB), not two. Rank 0's error is one
    line; no rank shows DCP's CheckpointException."""
    _, cfg = sharded_run
    with tmpfs(tmp_path / "small", "2000k") as small:
        run = small / "run"
        with pytest.raises(LcftError):
            launch("train", TrainConfig(**{**cfg, "out": str(run), "nproc": 2, "shard": "fsdp"}))
        out = capfd.readouterr()
        lines = [ln for ln in (out.out + out.err).splitlines() if "cannot save step 2" in ln]
        assert lines and all("no space left" in ln and "needs about" in ln for ln in lines), out
        assert any("step-00000001 is kept" in ln for ln in lines)
        assert "CheckpointException" not in out.out + out.err
        assert [s for s, _ in list_checkpoints(run)] == [1] and not _left(run)
        assert verify_checkpoint(run / "checkpoints" / "step-00000001")


@pytest.mark.parametrize("entry", ["export", "eval", "init"])
def test_damaged_shards_without_checksums_are_one_line(ckpt, sharded_run, tmp_path, data_dir, entry):
    (ckpt / CHECKSUMS).unlink()
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
