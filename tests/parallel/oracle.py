"""A parallel trainer run's metrics against its one-process oracle, beyond the losses each test compares."""

from __future__ import annotations

from pathlib import Path

import pytest

from lcft.train.metrics import read_metrics


def same_grad_norms(run: Path, oracle: Path, rel: float = 1e-5) -> None:
    """The logged pre-clip gradient norm of every step `run` took, against the oracle's same step. AdamW's update
    is invariant to a uniform gradient scale (and clipping hides one), so losses and weights cannot show a
    mis-normalised gradient (a wrong token count or accumulation factor on one layout): its norm can."""
    got, want = ({r["step"]: r["grad_norm"] for r in read_metrics(p)} for p in (run, oracle))
    assert got and set(got) <= set(want), (sorted(got), sorted(want))
    steps = sorted(got)
    assert [got[s] for s in steps] == pytest.approx([want[s] for s in steps], rel=rel), f"steps {steps}"


def same_samples(run: Path, oracle: Path) -> None:
    """The sample ids of every step `run` took are the oracle's of that step: no sample skipped or read twice
    across dp ranks and accumulation, and a resumed sampler goes on where it stopped."""
    got, want = ({r["step"]: r["samples"] for r in read_metrics(p)} for p in (run, oracle))
    assert got and set(got) <= set(want), (sorted(got), sorted(want))
    assert got == {step: want[step] for step in got}
