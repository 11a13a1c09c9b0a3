"""Loss-spike guard: non-finite and spiking updates are skipped and counted, the weights do not move, and too
many skips in a row stop the run with a checkpoint."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.state import read_state
from lcft.errors import LcftError
from lcft.train import TrainConfig, TrainHooks, train
from lcft.train.guard import GuardConfig, SpikeGuard
from lcft.train.metrics import read_metrics


def test_guard_statistics():
    losses = [2.9, 2.7, 2.6, 2.55, 2.5]
    g = SpikeGuard(GuardConfig(spike_sigma=3.0, spike_window=4, spike_min_history=3), losses)
    assert g.history == losses[-4:]  # the window keeps the newest
    expect = np.mean(losses[-4:]) + 3.0 * np.std(losses[-4:], ddof=1)
    assert g.threshold() == pytest.approx(expect)
    assert g.check(expect - 1e-6) == "ok" and g.check(expect + 1e-6) == "spike"
    assert g.check(math.nan) == "nonfinite" and g.check(2.0, grad_norm=math.inf) == "nonfinite"
    assert SpikeGuard(GuardConfig(spike_min_history=3), [2.0, 2.0]).check(50.0) == "ok"  # too little history
    assert SpikeGuard(GuardConfig(spike_sigma=0.0, spike_min_history=1), [2.0] * 5).check(50.0) == "ok"  # disabled


def _weights(run, step):
    return from_pretrained(run / "checkpoints" / f"step-{step:08d}").state_dict()


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_injected_nan_and_spike_are_skipped(tmp_path, base_cfg):
    def perturb(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss * math.nan if step == 6 else loss * 1000.0 if step == 9 else loss

    run = tmp_path / "run"
    cfg = TrainConfig(out=str(run), **{**base_cfg, "steps": 10, "save_every": 1, "keep_last": 0,
                                       "spike_min_history": 3})
    s = train(cfg, TrainHooks(perturb_loss=perturb))
    assert s["skipped"] == 2 and s["step"] == 10
    recs = {r["step"]: r for r in read_metrics(run)}
    assert recs[6]["skip"] == "nonfinite" and recs[9]["skip"] == "spike"
    assert [r["skipped"] for r in recs.values()] == [0] * 5 + [1] * 3 + [2] * 2
    assert all("skip" not in recs[k] for k in recs if k not in (6, 9))
    assert _same(_weights(run, 5), _weights(run, 6)) and _same(_weights(run, 8), _weights(run, 9))
    assert not _same(_weights(run, 6), _weights(run, 7))
    state = read_state(run / "checkpoints" / "step-00000010")
    assert state.updates == 8 and state.skipped == 2 and state.consecutive_skips == 0
    # the learning-rate schedule did not advance at the skipped steps
    assert recs[7]["lr"] == recs[6]["lr"] != recs[5]["lr"]
    assert recs[10]["lr"] == recs[9]["lr"] != recs[8]["lr"]


def test_a_skipped_step_names_the_objective_the_guard_judged(tmp_path, base_cfg, capsys):
    """The logged loss is the plain cross-entropy; the guard judges the objective (here made NaN, as a diverged
    router or z-loss term would): the record and the note name that figure beside the loss, which stays finite."""
    run = tmp_path / "run"
    cfg = TrainConfig(out=str(run), **{**base_cfg, "steps": 3, "softmask_loss_weight": 0.5})
    train(cfg, TrainHooks(perturb_loss=lambda step, loss: loss * math.nan if step == 2 else loss))
    recs = {r["step"]: r for r in read_metrics(run)}
    assert recs[2]["skip"] == "nonfinite" and math.isnan(recs[2]["objective"]) and math.isfinite(recs[2]["loss"])
    assert "objective" not in recs[1] and "objective" not in recs[3]
    assert f"step 2: update skipped (nonfinite, objective nan, loss {recs[2]['loss']:.4g})" in capsys.readouterr().err


def test_consecutive_skips_stop_the_run(tmp_path, base_cfg):
    run = tmp_path / "run"
    cfg = TrainConfig(out=str(run), **{**base_cfg, "steps": 10, "save_every": 1, "keep_last": 0,
                                       "max_consecutive_skips": 2})
    with pytest.raises(LcftError, match="2 skipped updates in a row"):
        train(cfg, TrainHooks(perturb_loss=lambda step, loss: loss * math.inf if step >= 3 else loss))
    assert read_state(run / "checkpoints" / "step-00000004").consecutive_skips == 2
    assert _same(_weights(run, 2), _weights(run, 4))
    assert not (run / "checkpoints" / "step-00000005").exists()


def test_one_skip_allowed_in_a_row_is_counted_in_the_singular(tmp_path, base_cfg):
    cfg = TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "steps": 3, "max_consecutive_skips": 1})
    with pytest.raises(LcftError, match=r"^1 skipped update in a row \(step 2: nonfinite, objective inf, loss "):
        train(cfg, TrainHooks(perturb_loss=lambda step, loss: loss * math.inf if step >= 2 else loss))
