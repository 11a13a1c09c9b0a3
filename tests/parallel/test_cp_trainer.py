"""Context parallelism through the trainer (torchrun, gloo): dp=2 x cp=2 with accumulation 2 equals one process with
accumulation 4, and a run resumes across cp sizes (cp=2 -> cp=1 and cp=1 -> cp=2) on the same trajectory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.errors import LcftError
from lcft.launch import run
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics
from tests.parallel.oracle import same_grad_norms, same_samples

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 4 + 2 torchrun processes: ~50 s


def _base(data: Path, init: Path) -> dict:
    return dict(data=str(data), init=str(init), seq_len=512, steps=2, global_batch=2, micro_batch=1, warmup=1,
                lr=1e-3, precision="fp32", save_every=1, keep_last=0, progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cp_data_dir, cp_init_dir) -> Path:
    """one: 1 process, accumulation 2. one4: 1 process, global batch 4 (accumulation 4). dpcp: the same global batch
    on 4 processes = dp 2 x cp 2 (zigzag, all-gathered K/V), accumulation 2 on each rank (every factor of the
    normaliser and of the sampler's split above 1). cp2to1: dpcp's step-1 checkpoint resumed on one process. cp1to2: one's step-1 checkpoint resumed on cp=2
    (contiguous, K/V streamed in pieces; 'selected' runs through lcft eval in test_cp_eval)."""
    root = tmp_path_factory.mktemp("cp-train")
    base = _base(cp_data_dir, cp_init_dir)
    base4 = dict(base, global_batch=4)
    train(TrainConfig(out=str(root / "one"), **base))
    train(TrainConfig(out=str(root / "one4"), **base4))
    s = run("train", TrainConfig(out=str(root / "dpcp"), nproc=4, cp=2, **base4))
    assert s["world_size"] == 4 and s["step"] == 2
    train(TrainConfig(out=str(root / "cp2to1"), resume=str(root / "dpcp/checkpoints/step-00000001"), **base4))
    s = run("train", TrainConfig(out=str(root / "cp1to2"), resume=str(root / "one/checkpoints/step-00000001"), nproc=2,
                          cp=2, cp_layout="contiguous", cp_kv="stream", **base))
    assert s["world_size"] == 2 and s["step"] == 2
    return root


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run)}


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = from_pretrained(a).state_dict(), from_pretrained(b).state_dict()
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_dp2_cp2_equals_one_process_with_accumulation(runs):
    one, dpcp = _losses(runs / "one4"), _losses(runs / "dpcp")
    assert sorted(dpcp) == [1, 2]
    for step in (1, 2):
        assert dpcp[step] == pytest.approx(one[step], rel=1e-5)
    same_samples(runs / "dpcp", runs / "one4")  # across dp x accumulation
    same_grad_norms(runs / "dpcp", runs / "one4")
    for step in ("step-00000001", "step-00000002"):
        _same_weights(runs / "dpcp/checkpoints" / step, runs / "one4/checkpoints" / step)


@pytest.mark.parametrize("run,oracle", [("cp2to1", "one4"), ("cp1to2", "one")])
def test_resume_across_cp_sizes(runs, run, oracle):
    assert _losses(runs / run)[2] == pytest.approx(_losses(runs / oracle)[2], rel=1e-5)
    same_grad_norms(runs / run, runs / oracle)  # cp1to2: cp with accumulation 2 on each rank
    _same_weights(runs / run / "checkpoints/step-00000002", runs / oracle / "checkpoints/step-00000002")


def test_world_not_divisible_by_cp_fails_before_any_work(tmp_path, cp_data_dir, cp_init_dir):
    out = tmp_path / "run"
    with pytest.raises(LcftError, match="cannot be split into context-parallel groups of 2"):
        train(TrainConfig(out=str(out), cp=2, **_base(cp_data_dir, cp_init_dir)))
    assert not out.exists()
