"""Kept probe losses and a finished probe report are keyed on the planted windows: under another planting rule (same
options) they are not read back, and the report is evaluated again."""

from __future__ import annotations

from lcft.evaluate import EvalConfig, evaluate
from tests.evaluate.planting import PRELUDE, substitute
from tests.evaluate.test_resume import _cfg, _counting, _killed


def test_a_probe_kept_under_another_planting_rule_is_run_again(data_dir, ckpt_a, tmp_path, monkeypatch):
    """Killed inside the copy probe while planting mutated copies by another rule (same options, other windows):
    its windows' losses are read back, its kept probe losses are not (all 12 planted windows run again)."""
    cfg = _cfg(data_dir, tmp_path / "killed", ckpt_a, probe="copy", probe_segment=256, probe_distances=[256, 1024],
               probe_windows=2)
    _killed(cfg, 6 + 5, before=PRELUDE)
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**cfg))
    assert len(calls) == 12


def test_a_report_planted_by_another_rule_is_not_taken_for_this_one(data_dir, ckpt_a, tmp_path, monkeypatch):
    """A finished report of the copy probe whose mutated copies were planted by another rule (same options) is
    evaluated again, not returned as already evaluated; rerun under the same rule, it is."""
    import lcft.evaluate.probe as probe

    cfg = EvalConfig(**_cfg(data_dir, tmp_path / "out", ckpt_a, probe="copy", probe_segment=256,
                            probe_distances=[256, 1024], probe_windows=2))
    with monkeypatch.context() as m:
        m.setattr(probe, "_mutate", substitute)
        evaluate(cfg)
        assert evaluate(cfg).get("already")
    assert not evaluate(cfg).get("already")
    assert evaluate(cfg).get("already")
