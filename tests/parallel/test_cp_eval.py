"""`lcft eval` on dp=2 x cp=2 ranks (torchrun, gloo) gives the one-process report, control pieces included."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.evaluate.store import PARTIAL
from lcft.launch import run
from tests.evaluate.test_resume import _counting, _killed
from tests.evaluate.test_resume_signals import _start_cli
from tests.train.launching import rank_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 6 launches of 2-4 torchrun processes: ~1.5 min


def _cfg(data, model, out, **changes) -> EvalConfig:
    # The same checkpoint twice: the whole window, and the control cut into independent 512-token pieces.
    return EvalConfig(data=str(data), checkpoints=(str(model), str(model)), labels=("full", "control"),
                      max_context=(0, 512), max_windows=3, out=str(out), probe="copy", probe_segment=128,
                      probe_distances=(256, 1024), probe_windows=1, **changes)


def _wait_for_kept(proc: subprocess.Popen, out: Path, windows: int, length: int) -> None:
    """Until the output folder keeps `windows` windows' losses (a process that ends first fails the test)."""
    deadline = time.monotonic() + 240
    while sum(p.stat().st_size for p in (out / PARTIAL).glob("*.losses")) < windows * length * 4:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.fixture(scope="module")
def one_200(tmp_path_factory, cp_data_dir, cp_init_dir) -> dict:
    """The one-process report over the 200 windows `_start_cli` asks for: what a launched eval of them, stopped or
    killed and resumed, must end with."""
    return evaluate(EvalConfig(data=str(cp_data_dir), checkpoints=(str(cp_init_dir),), max_windows=200, bootstrap=50,
                               out=str(tmp_path_factory.mktemp("cp-eval") / "one")))


def test_dp2_cp2_eval_equals_one_process(tmp_path, cp_data_dir, cp_init_dir):
    one = evaluate(_cfg(cp_data_dir, cp_init_dir, tmp_path / "one"))
    four = run("eval", _cfg(cp_data_dir, cp_init_dir, tmp_path / "four", nproc=4, cp=2, cp_kv="selected"))
    assert (tmp_path / "four" / "eval.json").is_file()
    for a, b in zip(one["checkpoints"], four["checkpoints"], strict=True):
        assert b["tokens"] == a["tokens"]
        for key in ("loss", "first_tenth_loss", "last_tenth_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-6)
        assert b["bins"]["loss"] == pytest.approx(a["bins"]["loss"], rel=1e-6)
        assert [w["index"] for w in b["windows"]] == [w["index"] for w in a["windows"]] == [0, 1, 2]
        assert [w["loss"] for w in b["windows"]] == pytest.approx([w["loss"] for w in a["windows"]], rel=1e-6)
        # The copy probe's planted windows take the same path: the same drops by distance.
        assert b["probe"]["drop"] == pytest.approx(a["probe"]["drop"], rel=1e-4, abs=1e-6)
        assert b["probe"]["loss_without"] == pytest.approx(a["probe"]["loss_without"], rel=1e-6)


def test_eval_cp_without_enough_processes_fails_before_any_work(tmp_path, cp_data_dir, cp_init_dir):
    out = tmp_path / "bad"
    with pytest.raises(LcftError, match="world size 1 is not divisible by cp=2"):
        evaluate(_cfg(cp_data_dir, cp_init_dir, out, cp=2))
    assert not out.exists()


def test_dp2_eval_resumes_a_killed_one_process_eval(tmp_path, cp_data_dir, cp_init_dir):
    """The main rank reads back the windows a killed run kept and hands them to the other rank; both then take
    the remaining batches in turns: the report is the one-process report."""
    cfg = dict(data=str(cp_data_dir), checkpoints=[str(cp_init_dir)], out=str(tmp_path / "killed"), max_windows=6)
    _killed(cfg, 4)  # windows 0-2 kept
    assert len(list((tmp_path / "killed" / PARTIAL).glob("*.losses"))) == 1
    two = run("eval", EvalConfig(**{**cfg, "checkpoints": tuple(cfg["checkpoints"]), "nproc": 2}))
    assert not (tmp_path / "killed" / PARTIAL).exists()
    one = evaluate(EvalConfig(**{**cfg, "checkpoints": tuple(cfg["checkpoints"]), "out": str(tmp_path / "one")}))
    (a,), (b,) = one["checkpoints"], two["checkpoints"]
    assert [w["index"] for w in b["windows"]] == list(range(6))
    assert [w["loss"] for w in b["windows"]] == pytest.approx([w["loss"] for w in a["windows"]], rel=1e-6)
    assert b["bins"]["loss"] == pytest.approx(a["bins"]["loss"], rel=1e-6)


def test_a_killed_rank_is_restarted_and_the_eval_resumes(tmp_path, cp_data_dir, cp_init_dir, one_200):
    """`lcft eval --nproc 2 --max-restarts 1`, rank 1 SIGKILLed once 8 windows are kept: the agent restarts both
    ranks, which read those windows back and compute the rest; exit 0 with the one-process report."""
    out = tmp_path / "elastic"
    proc = _start_cli(cp_data_dir, cp_init_dir, out, "--nproc", "2", "--max-restarts", "1")
    _wait_for_kept(proc, out, 8, 2048)
    rank_process(proc, 1).kill()
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "read back from an interrupted run" in stdout + err
    two = json.loads((out / "eval.json").read_text())
    (a,), (b,) = one_200["checkpoints"], two["checkpoints"]
    assert [w["loss"] for w in b["windows"]] == pytest.approx([w["loss"] for w in a["windows"]], rel=1e-6)
    assert not (out / PARTIAL).exists()


def test_sigterm_to_a_launched_eval_stops_every_rank_after_the_same_batch(tmp_path, cp_data_dir, cp_init_dir,
                                                                         one_200, monkeypatch):
    """`lcft eval --nproc 2`: the launcher passes SIGTERM on, the ranks agree to stop after one batch, the
    command exits 143 saying the losses are kept (exit 1, "processes failed", before); run again (here in one
    process), it computes only the windows not kept and gives the one-process report."""
    out = tmp_path / "stopped"
    proc = _start_cli(cp_data_dir, cp_init_dir, out, "--nproc", "2", "--quiet")
    _wait_for_kept(proc, out, 4, 2048)
    proc.terminate()
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM: the losses computed so far are kept" in stdout
    assert not (out / "eval.json").exists()
    (kept,) = (out / PARTIAL).glob("*.losses")
    done, torn = divmod(kept.stat().st_size, 2048 * 4 + 2048 // 8 + 8 + 16)  # losses, flags, index, digest
    assert torn == 0 and 4 <= done < 200
    calls = _counting(monkeypatch)
    two = evaluate(EvalConfig(data=str(cp_data_dir), checkpoints=(str(cp_init_dir),), out=str(out), max_windows=200,
                              bootstrap=50))
    assert sum(calls) == 200 - done
    (a,), (b,) = one_200["checkpoints"], two["checkpoints"]
    assert [w["loss"] for w in b["windows"]] == pytest.approx([w["loss"] for w in a["windows"]], rel=1e-6)


def test_sigterm_to_every_process_of_a_launched_eval_keeps_the_batch(tmp_path, cp_data_dir, cp_init_dir):
    """SIGTERM to the launcher, torchrun's agent and the workers (a scheduler's scancel; the agent passes it on
    too): exit 143 saying the losses are kept, as when the launcher alone gets it. It printed the agent's
    traceback and 'stopped by SIGTERM while the workers were starting, before they saved'."""
    out = tmp_path / "stopped"
    proc = _start_cli(cp_data_dir, cp_init_dir, out, "--nproc", "2", "--quiet")
    _wait_for_kept(proc, out, 4, 2048)
    launcher = psutil.Process(proc.pid)
    everyone = [launcher, *launcher.children(recursive=True)]
    assert len(everyone) == 4
    for p in everyone:
        p.terminate()
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM: the losses computed so far are kept" in stdout
    assert "Traceback" not in err and not [ln for ln in err.splitlines() if ln.startswith("error: ")], err[-3000:]
    assert sum(p.stat().st_size for p in (out / PARTIAL).glob("*.losses")) >= 4 * 2048 * 4  # (as waited for)
    assert not (out / "eval.json").exists()


def test_a_killed_rank_ends_a_launched_eval_with_75_and_how_to_resume(tmp_path, cp_data_dir, cp_init_dir):
    """Without --max-restarts, rank 1 SIGKILLed: exit 75 naming it, and the hint is eval's own (a training run's
    `--resume auto` before)."""
    out = tmp_path / "lost"
    proc = _start_cli(cp_data_dir, cp_init_dir, out, "--nproc", "2", "--quiet")
    _wait_for_kept(proc, out, 4, 2048)
    rank_process(proc, 1).kill()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert "rank 1" in line and "killed by SIGKILL" in line, line
    assert line.endswith("the losses of its finished batches kept: run the same command again to resume"), line
