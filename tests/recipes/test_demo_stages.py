"""A demo training stage around its run (train itself stood in for): a folder holding another demo run is refused
with the demo's own words, and a run a signal stopped stops the whole demo with that signal's exit code; the
evaluation stage (evaluate stood in for) told of more windows than are held out."""

from __future__ import annotations

from pathlib import Path

import pytest

import lcft.train
from lcft.config_toml import absolute_paths, save_resolved, to_dict
from lcft.errors import LcftError
from lcft.recipes.demo import train_stage
from lcft.signals import Stopped
from lcft.train import TrainConfig


def _cfg(tmp_path, steps: int) -> TrainConfig:
    return TrainConfig(data=str(tmp_path / "data"), out=str(tmp_path / "run"), init=str(tmp_path / "init"),
                       steps=steps, seq_len=256, global_batch=2, micro_batch=2, precision="fp32")


@pytest.fixture
def trained(monkeypatch) -> list[TrainConfig]:
    """The configs `train` was called with; each call ends as a signal stopped it (SIGRTMIN+1 at step 2)."""
    calls: list[TrainConfig] = []

    def train(cfg: TrainConfig) -> dict:
        calls.append(cfg)
        return {"stopped": "signal", "signal": "SIGRTMIN+1", "signal_number": 35, "step": 2, "checkpoint": "c"}

    monkeypatch.setattr(lcft.train, "train", train)
    return calls


def test_a_folder_of_another_demo_run_is_refused_before_training(tmp_path, trained):
    """Its saved config.toml differs in an option that defines the run: refused with or without checkpoints (a
    demo never resumes a run of other options), as the run folder's own check finds the difference."""
    (tmp_path / "run").mkdir()
    save_resolved(tmp_path / "run" / "config.toml", to_dict(absolute_paths(_cfg(tmp_path, 4))))
    with pytest.raises(LcftError, match=r"run holds a demo run made with other options \(steps: 4 -> 3\); choose "
                                        r"another --out, or delete that folder to start over$"):
        train_stage(_cfg(tmp_path, 3))
    assert trained == []


def test_a_stopped_stage_stops_the_demo_with_the_signals_exit_code(tmp_path, trained):
    """The exit code is 128 + the summary's signal_number (here a realtime signal, whose name signal.Signals[...]
    does not know), the message names the signal by its name."""
    (tmp_path / "run").mkdir()
    save_resolved(tmp_path / "run" / "config.toml", to_dict(absolute_paths(_cfg(tmp_path, 3))))  # the same run
    with pytest.raises(Stopped, match=r"^stopped by SIGRTMIN\+1 at step 2 of .*run \(checkpoint c\)") as e:
        train_stage(_cfg(tmp_path, 3))
    assert e.value.exit_code == 128 + 35 and len(trained) == 1


def test_a_signal_that_came_as_the_run_finished_still_stops_the_demo(tmp_path, monkeypatch):
    """The stage's run is complete ("done", exit code 0 for `lcft train`), but SIGTERM came during its last step:
    the user asked the demo to stop, so it stops after this stage with 143 rather than going on to the next."""
    monkeypatch.setattr(lcft.train, "train", lambda cfg: {"stopped": "done", "signal": "SIGTERM",
                                                          "signal_number": 15, "step": 3, "checkpoint": "c"})
    with pytest.raises(Stopped, match=r"^stopped by SIGTERM at step 3 of .*run \(checkpoint c\)") as e:
        train_stage(_cfg(tmp_path, 3))
    assert e.value.exit_code == 143


def test_a_finished_run_with_no_signal_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(lcft.train, "train", lambda cfg: {"stopped": "done", "signal": None,
                                                          "signal_number": None, "step": 3, "checkpoint": "c"})
    assert train_stage(_cfg(tmp_path, 3)) == (Path("c"), "trained")


def test_eval_windows_above_the_held_out_windows_are_said_as_the_demos_own_flag(tmp_path, capsys, monkeypatch):
    """--eval-windows 50 over the few 128K windows of chr22: said once, at the prepare stage (before training), as
    --eval-windows; the evaluation then reads them all without a warning naming eval's --max-windows, a flag the
    demo does not have (the user saw `--max-windows 50 is more than split 'eval' holds` after the training)."""
    import lcft.evaluate.runner
    from lcft.genomics import open_windows
    from lcft.recipes.demo import DemoConfig, DemoPaths, eval_config, eval_stage, prepare_stage

    evaluated = []

    def evaluate(ecfg, **kwargs):
        evaluated.append(ecfg)
        raise LookupError("evaluated")

    monkeypatch.setattr(lcft.evaluate.runner, "evaluate", evaluate)
    cfg = DemoConfig(out=str(tmp_path), length=131072, eval_windows=50, probe_windows=3, control_steps=0)
    paths = DemoPaths(tmp_path)
    prepare_stage(cfg, paths.data, progress=False)
    held = len(open_windows(paths.data, "eval"))
    assert 1 < held < 50
    assert capsys.readouterr().err == (f"warning: --eval-windows 50 is more than split 'eval' holds ({held} windows): "
                                       "all of them are evaluated\n")
    with pytest.raises(LookupError):
        eval_stage(eval_config(cfg, paths, tmp_path / "base", tmp_path / "long"), paths.report, False, 0)
    assert evaluated[0].windows_of(held) == held and evaluated[0].capped(held) == []
