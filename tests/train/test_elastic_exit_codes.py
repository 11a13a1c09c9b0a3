"""Exit codes a scheduler sees from `lcft train` (one process): 0 for a finished run, 128 + N after signal N
stopped the run with its checkpoint (143 SIGTERM, 130 SIGINT), so a preempted job is not taken for done."""

from __future__ import annotations

import json
import signal

import pytest

from lcft.checkpoint.state import read_state
from lcft.train import latest_checkpoint
from lcft.train.metrics import read_metrics
from tests.train.launching import error_lines, start_train, wait_for_step

pytestmark = pytest.mark.slow


def test_a_finished_run_exits_0(tmp_path, data_dir, init_dir):
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--steps", 2, "--save-every", 0)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "done at step 2/2" in out and json.loads((run / "summary.json").read_text())["signal"] is None


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_then_exits_128_plus_its_number(tmp_path, data_dir, init_dir, sig, code):
    run = tmp_path / "run"
    proc = start_train(data_dir, init_dir, run, "--steps", 100000, "--save-every", 0)
    wait_for_step(run, 2, [proc])
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-3000:]
    assert error_lines(err) == [] and f"stopped by {sig.name} at step" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == "signal" and summary["signal"] == sig.name
    assert read_state(latest_checkpoint(run)).step == read_metrics(run)[-1]["step"] == summary["step"] >= 2
