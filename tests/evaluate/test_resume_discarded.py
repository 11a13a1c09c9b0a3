"""A rerun that reads back none of a kept pass (another layout, option or checkpoint than the stopped run's) says
so once, on stderr, naming what changed; one that resumes says nothing of the kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.store import PARTIAL, LossStore
from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture killed_a needs, by name)
from tests.evaluate.test_resume import _copy_killed, _counting, _rerun, killed_a, model_link  # noqa: F401

NOT_READ = "kept pass of losses not read back"


def _as_other_pass(out: Path, **changed: object) -> None:
    """The one kept pass of `out` moved to where a run whose identity differs by `changed` keeps it, as that
    run, stopped, would have left it (its note saying so)."""
    (losses,) = (out / PARTIAL).glob("*.losses")
    identity = json.loads(losses.with_suffix(".json").read_text()) | changed
    moved = LossStore(out, identity, identity["length"]).path
    losses.rename(moved)
    losses.with_suffix(".json").unlink()
    moved.with_suffix(".json").write_text(json.dumps(identity))


@pytest.mark.parametrize(("change", "why"), [
    ({"cp": [2, "zigzag", "all"]}, "the layout changed: cp=2 -> cp=1"),
    ({"precision": "bf16"}, "precision fp32 -> bf16"),
    ({"max_context": ["1K"]}, "max_context 0 -> 1024"),
    ({"batch_size": 2}, "batch_size 1 -> 2"),
    ({"checkpoint": "b"}, "the checkpoint changed: other weights"),
])
def test_a_kept_pass_not_read_back_is_said_once_with_why(killed_a, model_link, ckpt_a, ckpt_b, tmp_path,  # noqa: F811
                                                         monkeypatch, capsys, change, why):
    """The stopped run's pass (windows 0-4 kept) under another --cp (its pass moved to where a --cp 2 run keeps
    it), --precision, --max-context, --batch-size or checkpoint: every window computed, and one line on stderr
    naming the folder and what changed."""
    cfg = _copy_killed(killed_a, tmp_path / "killed")
    change = dict(change)
    if "cp" in change:
        _as_other_pass(tmp_path / "killed", cp=change.pop("cp"))
    capsys.readouterr()
    assert _rerun(cfg, change, monkeypatch, model_link, (ckpt_a, ckpt_b)) == 6
    said = [line for line in capsys.readouterr().err.splitlines() if NOT_READ in line]
    assert said == [f"{tmp_path / 'killed' / PARTIAL}: 1 {NOT_READ} ({why}): discarded, its losses are computed "
                    "again"], said


def test_a_resumed_pass_says_nothing_discarded(killed_a, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Fewer windows than kept (--max-windows 3): the kept pass is read back, nothing is said discarded."""
    cfg = _copy_killed(killed_a, tmp_path / "killed")
    capsys.readouterr()
    calls = _counting(monkeypatch)
    evaluate(EvalConfig(**{**cfg, "max_windows": 3}))
    assert calls == [] and NOT_READ not in capsys.readouterr().err
