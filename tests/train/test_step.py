"""The per-micro-batch loss against a plain full-logits computation, the step's loss normaliser against the
whole batch's per-token mean, and the learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcft.genomics.dataset import batch_counts
from lcft.model import Llama
from lcft.train.config import TrainConfig
from lcft.train.global_step import Normaliser
from lcft.train.step import LossModel, compute_loss, lr_factor, make_optimizer, make_scheduler, warmup_note

from .conftest import small_model_config


def test_compute_loss_matches_full_logits():
    """Σ w·(ce + z·lse²) over counted tokens, from materialised fp32 logits (the oracle), incl. weights; and the
    plain Σ ce the metrics report (no weights, no z-loss), soft-masked tokens at full weight."""
    torch.manual_seed(0)
    model = Llama(small_model_config())
    ids = torch.randint(4, 9, (2, 96))  # (B, L) with some N (8)
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)  # (B, L)
    labels = torch.where(labels == 8, -100, labels)
    weights = torch.where(torch.rand(2, 96) < 0.3, 0.1, 1.0)  # (B, L) soft-mask weighting
    z = 1e-2
    ls, count, ce_sum = compute_loss(LossModel(model, z, chunk=40), {"input_ids": ids, "labels": labels,
                                                                      "weights": weights})
    logits = model(ids).double()  # (B, L, V)
    lse = torch.logsumexp(logits, -1)  # (B, L)
    keep = labels != -100
    ce = lse - logits.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    w = torch.where(keep, weights.double(), 0.0)
    assert count.item() == keep.sum().item()
    torch.testing.assert_close(ls.double(), (w * (ce + z * lse**2)).sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce_sum.double(), torch.where(keep, ce, 0.0).sum(), rtol=1e-5, atol=1e-5)
    assert not ce_sum.requires_grad  # a figure for the log, not part of the objective


def test_normaliser_weighs_every_counted_token_of_the_step_alike():
    """Two micro-batches with unequal counted tokens, accumulated as the trainer does (backward of loss_sum x scale,
    which Accelerate divides by the accumulation steps): the loss and gradient of the whole batch's per-token mean
    (the oracle: one forward of both), not the mean of the two micro-batches' means."""
    torch.manual_seed(0)
    model = Llama(small_model_config())
    ids = torch.randint(4, 9, (2, 64))  # (B, L): micro-batch k is row k
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
    labels[0, 5:50] = -100  # 18 counted tokens against 63
    micro = [{"input_ids": ids[k:k + 1], "labels": labels[k:k + 1]} for k in range(2)]
    bases = np.arange(model.config.vocab_size, dtype=np.int64)  # any per-label table: bases are summed as given
    norm = Normaliser.of(batch_counts(micro, bases), cp=1, world=1, accum=2)
    assert norm.count == 81 and norm.bases == bases[labels[labels != -100]].sum()
    loss_model = LossModel(model, 0.0, chunk=40)
    total = 0.0
    for batch in micro:
        ls, _, _ = compute_loss(loss_model, batch)
        (ls * norm.scale / 2).backward()  # / 2: Accelerate's division by the accumulation steps
        total += ls.item()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ls, count, _ = compute_loss(loss_model, {"input_ids": ids, "labels": labels})
    (ls / count).backward()
    assert norm.per_token(total) == pytest.approx((ls / count).item(), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-6, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    empty = Normaliser.of([0.0, 0.0], cp=1, world=1, accum=2)  # every label ignored: 0, never NaN
    assert empty.per_token(0.0) == 0.0 and math.isfinite(empty.scale)


def test_lr_schedule():
    assert [lr_factor(u, 4, 20, 0.1) for u in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(20, 4, 20, 0.1) == pytest.approx(0.1) and lr_factor(50, 4, 20, 0.1) == pytest.approx(0.1)
    assert lr_factor(12, 4, 20, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down the cosine
    cfg = TrainConfig(lr=1e-3, warmup=2, steps=10, min_lr_ratio=0.0)
    opt = make_optimizer(Llama(small_model_config()), cfg)
    sched = make_scheduler(opt, cfg)
    seen = []
    for _ in range(11):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[:4] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3 * 0.5 * (1 + math.cos(math.pi / 8))])
    assert seen[10] == pytest.approx(0.0, abs=1e-12)
    # norms are not decayed
    assert [g["weight_decay"] for g in opt.param_groups] == [cfg.weight_decay, 0.0]
    assert all(p.ndim == 1 for p in opt.param_groups[1]["params"])



@pytest.mark.parametrize(("steps", "warmup", "step", "updates", "left"), [
    (6, 10, 0, 0, 6), (6, 6, 0, 0, 6), (7, 6, 0, 0, None),   # a fresh run: --warmup >= --steps
    (20, 10, 3, 3, None), (12, 10, 4, 2, 8),                 # resumed: 2 skipped updates kept the schedule back
    (6, 10, 5, 5, 1),                                        # resumed with one step left: "the 1 step left"
    (6, 10, 6, 6, None)])                                    # nothing left to train
def test_warmup_note_when_every_update_left_is_a_warmup_one(steps, warmup, step, updates, left):
    """The note names both options and the last lr the run reaches, from the schedule's definition (a linear rise
    to the peak over --warmup updates), not from lr_factor."""
    from lcft.train.config import OptimConfig

    cfg = OptimConfig(steps=steps, warmup=warmup, lr=3e-4)
    note = warmup_note(cfg, step, updates)
    in_warmup = all(u < warmup for u in range(updates, updates + steps - step)) and step < steps
    assert (note is not None) == in_warmup == (left is not None), note
    if note:
        last = 3e-4 * min(1.0, (updates + left) / warmup)
        assert f"--warmup {warmup}" in note and f"--steps {steps}" in note and f"to {last:.2e} of" in note, note
        assert (f"the {left} step{'s' if left > 1 else ''} left of" in note) == (step > 0), note
