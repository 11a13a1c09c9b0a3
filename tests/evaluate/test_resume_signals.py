"""SIGTERM or SIGINT to `lcft eval`: the batch under way is finished and kept, the command exits 128 + N, and a rerun
resumes from the kept losses to the uninterrupted report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.store import PARTIAL
from tests.evaluate.test_resume import KILLER, ROOT, _cfg, _counting, _same_report


def _start_cli(data_dir, ckpt, out: Path, *args: str, windows: int = 200, stop_at: int = 0) -> subprocess.Popen:
    """`lcft eval` of `windows` windows; `stop_at`: stopped (SIGSTOP) inside that forward pass (KILLER)."""
    cmd = [sys.executable, *(("-c", KILLER, "cli", str(stop_at), str(signal.SIGSTOP.value)) if stop_at else
                             ("-m", "lcft", "eval")), "--data", str(data_dir), "-c", str(ckpt), "--out", str(out),
           "--max-windows", str(windows), "--bootstrap", "50", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))


STOPPED = 8  # windows of the eval a signal stops in its fourth


@pytest.fixture(scope="module")
def clean_stopped(tmp_path_factory, data_dir, ckpt_a) -> Path:
    """The output folder of an uninterrupted eval of model a over those windows."""
    out = tmp_path_factory.mktemp("clean-stopped") / "clean"
    evaluate(EvalConfig(**_cfg(data_dir, out, ckpt_a) | {"max_windows": STOPPED}))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_batch_with_128_plus_n(data_dir, ckpt_a, clean_stopped, tmp_path, monkeypatch,
                                                       sig):
    """SIGTERM (a scheduler) or SIGINT (Ctrl-C) to `lcft eval`: the batch under way is finished and kept, the
    command says so and exits 128 + N, no report; run again, it resumes and ends with the uninterrupted report."""
    out = tmp_path / "stopped"
    proc = _start_cli(data_dir, ckpt_a, out, "--quiet", windows=STOPPED, stop_at=4)
    deadline = time.monotonic() + 240
    while proc.poll() is None and psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    (kept,) = (out / PARTIAL).glob("*.losses")
    record = 2048 * 4 + 2048 // 8 + 8 + 16  # losses, counted flags packed, index, digest
    assert kept.stat().st_size == 3 * record  # stopped inside the fourth window's batch
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"stopped by {sig.name}: the losses computed so far are kept in {out / PARTIAL}" in stdout
    assert "Traceback" not in err and not (out / "eval.json").exists()
    assert kept.stat().st_size == 4 * record  # the batch under way finished and kept, whole, and no other
    calls = _counting(monkeypatch)
    cfg = _cfg(data_dir, out, ckpt_a) | {"max_windows": STOPPED}
    evaluate(EvalConfig(**cfg))
    assert len(calls) == STOPPED - 4
    _same_report(out, clean_stopped)
