"""The launcher's worker entry (`python -m lcft.launch JOB CONFIG.toml`) and an eval launch that fails on
every rank: the error raised once, as one rank raised it, nothing printed by the workers, the temporary config
removed, the report from before kept as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lcft.config_toml import save_resolved, to_dict
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.launch import run
from lcft.launch.__main__ import main
from lcft.launch.process import HANDED_ENV, READY_ENV, RESULT_FILE_ENV, handed_over


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin the launcher to one of them")
def test_a_launcher_pinned_to_one_cpu_gives_its_worker_one_thread(tmp_path):
    """taskset or a Slurm cpuset of one CPU: the workers' OMP_NUM_THREADS shares the CPUs the launcher may use,
    not the machine's (it had been every CPU of the machine for one worker)."""
    cpu = min(os.sched_getaffinity(0))
    code = ("import os, types\n"
            f"os.sched_setaffinity(0, {{{cpu}}})\n"
            "from lcft.launch import _environment\n"
            f"cfg = types.SimpleNamespace(nproc=1, nnodes=1, node_rank=0, out={str(tmp_path)!r})\n"
            "print(_environment(cfg, {})['OMP_NUM_THREADS'])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert got.returncode == 0 and got.stdout == "1\n", got


def test_the_users_thread_count_is_kept(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lcft.launch import _environment

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    cfg = SimpleNamespace(nproc=4, nnodes=1, node_rank=0, out=str(tmp_path))
    assert _environment(cfg, {})["OMP_NUM_THREADS"] == "3"


def test_a_blank_thread_count_is_unset_and_the_workers_share_the_cpus(tmp_path, monkeypatch):
    """A job script's `export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK` where that is unset: the blank value was kept,
    and each worker's libgomp ignored it (with a warning) and took every CPU."""
    from types import SimpleNamespace

    from lcft.cpus import usable_cpus
    from lcft.launch import _environment

    monkeypatch.setenv("OMP_NUM_THREADS", " ")
    cfg = SimpleNamespace(nproc=2, nnodes=1, node_rank=0, out=str(tmp_path))
    assert _environment(cfg, {})["OMP_NUM_THREADS"] == str(max(1, usable_cpus() // 2))


def test_worker_refuses_a_bad_command_line(capsys):
    assert main([]) == 2
    assert main(["export", "x.toml"]) == 2
    assert capsys.readouterr().err.count("usage: python -m lcft.launch {train,eval} CONFIG.toml") == 2


def _failing_spec(tmp_path: Path) -> tuple[Path, str]:
    """An eval config that fails with a user error, and the message it fails with when run in this process."""
    cfg = EvalConfig(data=str(tmp_path / "missing"), checkpoints=(str(tmp_path / "model"),), out=str(tmp_path / "r"))
    with pytest.raises(LcftError) as direct:
        evaluate(cfg)
    return save_resolved(tmp_path / "eval.toml", to_dict(cfg)), str(direct.value)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_worker_prints_a_user_error_on_rank_0_only(tmp_path, capsys, monkeypatch, rank):
    """Under torchrun started by hand (no launcher to hand the error to)."""
    spec, message = _failing_spec(tmp_path)
    monkeypatch.delenv(HANDED_ENV, raising=False)
    monkeypatch.setenv("RANK", rank)
    assert main(["eval", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {message}\n" if rank == "0" else "")


@pytest.mark.parametrize("rank", ["0", "1"])
def test_worker_hands_a_user_error_to_the_launcher(tmp_path, capsys, monkeypatch, rank):
    """Under lcft's launcher a rank with a user error writes it, under its rank, into the launcher's folder, and
    prints nothing (the launcher raises it, once)."""
    spec, message = _failing_spec(tmp_path)
    errors = tmp_path / "errors"
    errors.mkdir()
    monkeypatch.setenv(HANDED_ENV, str(errors))
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr("lcft.launch.__main__.HAND_OVER_S", 0.0)  # no launcher here to end the wait
    assert main(["eval", str(spec)]) == 1
    assert [h[:4] for h in handed_over(errors)] == [(int(rank), 0, 1, message)]
    assert capsys.readouterr().err == ""


def test_a_user_error_that_cannot_be_handed_over_is_printed_by_rank_0(tmp_path, capsys, monkeypatch):
    """The launcher's folder cannot take the error (a full disk, often the error's own cause; here: gone): rank 0
    prints it, one line, as under torchrun started by hand, never a traceback of the failed hand-over."""
    spec, message = _failing_spec(tmp_path)
    monkeypatch.setenv(HANDED_ENV, str(tmp_path / "gone"))
    monkeypatch.setenv("RANK", "0")
    assert main(["eval", str(spec)]) == 1
    assert capsys.readouterr().err == f"error: {message}\n"



def test_a_worker_that_cannot_say_it_is_ready_hands_that_over_before_its_work(tmp_path, capsys, monkeypatch):
    """The launcher passes a stop signal on to a worker only once it said it is ready (a file in the launcher's
    folder): one that cannot write there would train on past every stop, so its work never starts and the launcher
    raises why (here the folder is a file: as root, a mode 0500 folder would still take it)."""
    ran = []
    monkeypatch.setattr("lcft.evaluate.runner.evaluate", lambda cfg, **_kw: ran.append(cfg) or {"checkpoints": 0})
    cfg = EvalConfig(data=str(tmp_path / "d"), checkpoints=(str(tmp_path / "m"),), out=str(tmp_path / "r"))
    spec = save_resolved(tmp_path / "eval.toml", to_dict(cfg))
    errors, folder = tmp_path / "errors", tmp_path / "ready"
    errors.mkdir()
    folder.write_text("")
    monkeypatch.setenv(HANDED_ENV, str(errors))
    monkeypatch.setenv(READY_ENV, str(folder))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr("lcft.launch.__main__.HAND_OVER_S", 0.0)  # no launcher here to end the wait
    assert main(["eval", str(spec)]) == 1
    assert not ran
    message = (f"cannot write to the launch's temporary folder {folder} (Not a directory): a stop signal could not "
               "be passed on to the workers; free space there or set TMPDIR to a writable folder")
    assert [h[:4] for h in handed_over(errors)] == [(1, 0, 1, message)]
    assert capsys.readouterr().err == ""

# Stands in for the job's work in a worker process: a summary (success) or an internal error (a bug).
FAKE_WORK = """
import os
import lcft.evaluate.runner as runner

def work(cfg):
    if os.environ["FAKE_WORK"] == "bug":
        raise RuntimeError("a broken internal contract")
    return {"checkpoints": 0}

runner.evaluate = work
"""


@pytest.mark.parametrize("outcome", ["ok", "bug", "unready", "unwritable"])
def test_a_worker_process_exits_with_its_outcome(tmp_path, outcome):
    """As torchrun starts it: a finished job exits 0 with its summary handed back; a bug exits 1 with its
    traceback (the worker ends with os._exit, so nothing of Python's own exit path may be relied on); a worker
    that cannot say it is ready (the launcher's folder full: here, a file) exits 1 before its work, one line; one
    that cannot hand its summary back (here its file is a folder) exits 1 after it, one line."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(FAKE_WORK)
    cfg = EvalConfig(data=str(tmp_path / "d"), checkpoints=(str(tmp_path / "m"),), out=str(tmp_path / "r"))
    spec = save_resolved(tmp_path / "eval.toml", to_dict(cfg))
    result = tmp_path / "result.json"
    path = os.pathsep.join([str(tmp_path / "hook"), str(Path(__file__).resolve().parents[2])])
    env = dict(os.environ, PYTHONPATH=path, RANK="0", FAKE_WORK=outcome, **{RESULT_FILE_ENV: str(result)})
    if outcome == "unready":
        (tmp_path / "ready").write_text("")
        env[READY_ENV] = str(tmp_path / "ready")
    if outcome == "unwritable":
        result.mkdir()
    res = subprocess.run([sys.executable, "-m", "lcft.launch", "eval", str(spec)], env=env, capture_output=True,
                         text=True, timeout=120)
    if outcome == "ok":
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(result.read_text()) == {"checkpoints": 0}
    elif outcome == "bug":
        assert res.returncode == 1 and not result.exists()
        assert "Traceback" in res.stderr and "RuntimeError: a broken internal contract" in res.stderr
    elif outcome == "unready":
        assert res.returncode == 1 and not result.exists()
        assert res.stderr.startswith(f"error: cannot write to the launch's temporary folder {tmp_path / 'ready'} ")
        assert res.stderr.count("\n") == 1, res.stderr
    else:
        assert res.returncode == 1 and result.is_dir()
        assert res.stderr == (f"error: cannot write to the launch's temporary folder {tmp_path} (Is a directory): "
                              "the work finished, but how it ended could not be handed back to the launcher; free "
                              "space there or set TMPDIR to a writable folder\n")


@pytest.mark.distributed
def test_eval_launch_failing_on_every_rank(tmp_path, capfd):
    from lcft.checkpoint.hf_folder import save_pretrained
    from lcft.genomics import prepare_windows, sample_fasta
    from lcft.model import Llama, LlamaConfig

    data = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=2048, train=("chr2",), eval=("chr22",))
    torch.manual_seed(0)
    save_pretrained(Llama(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)), tmp_path / "model")
    out = tmp_path / "report"
    out.mkdir()
    (out / "eval.json").write_text("{}")  # a report from before: neither taken for this run's nor lost
    # 768 does not divide the 2048-token window: every rank refuses it once the cp group is known.
    cfg = EvalConfig(data=str(data), checkpoints=(str(tmp_path / "model"),), max_context=(768,), max_windows=1,
                     out=str(out), nproc=2, cp=2)
    capfd.readouterr()
    with pytest.raises(LcftError, match=r"--max-context 768 does not divide the window \(2048\) under --cp 2"):
        run("eval", cfg)
    said = capfd.readouterr()
    assert said.out == said.err == "", said  # neither the workers nor torchrun's agent printed anything
    assert sorted(p.name for p in out.iterdir()) == ["eval.json"] and (out / "eval.json").read_text() == "{}"


class _NotStarted(Exception):
    """Raised where a launch would make its temporary folder: what came before it is all that ran."""


def test_node_0_of_several_checks_the_run_folder_under_its_lock(tmp_path, monkeypatch):
    """Node 0's launcher of a launch over 2 nodes checks the run folder before its agent starts (check_run_folder,
    which removes what interrupted saves left and puts back a step a failed save left aside). Another run writing
    there (its lock held) is refused before that: the other run's save being written, a temp folder, is kept. The
    check ran unlocked and removed it. With no other writer the check runs and leaves the lock free for rank 0."""
    import lcft.launch as launching
    from lcft.folder_lock import folder_lock
    from lcft.train import TrainConfig

    def not_started() -> None:
        raise _NotStarted

    monkeypatch.setattr(launching, "launch_folder", not_started)
    run = tmp_path / "run"
    writing = run / "checkpoints" / ".tmp-step-00000005-0a1b2c3d"  # the other run's save, not yet renamed
    writing.mkdir(parents=True)
    cfg = TrainConfig(data=str(tmp_path / "data"), out=str(run), nnodes=2, node_rank=0, rdzv_endpoint="h:1")
    entry = launching.job("train").entry()
    with folder_lock(run, "lcft train"), pytest.raises(LcftError, match="another `lcft train` is writing into"):
        launching.launch("train", cfg, entry)
    assert writing.is_dir()
    with pytest.raises(_NotStarted):  # no other writer: the check ran (the interrupted save's folder removed)
        launching.launch("train", cfg, entry)
    assert not writing.exists()
    with folder_lock(run, "lcft train"):  # and the lock is free again, for rank 0
        pass
