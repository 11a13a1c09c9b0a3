"""A user error found inside the processes of `lcft train --nproc 2`, as a terminal shows it: one `error:` line,
the one the same command prints without --nproc, exit 1, no traceback from any rank, no C++ stack trace of the
others torn out of their collectives, torchrun's agent silent, and no run folder. Found by every rank, by rank 0
only (its end took the run's store with it), or by rank 1 only (rank 0 said nothing). The launcher's choice:
rank 0's error, else the first; none when a worker of the node had already ended (killed by the OOM killer, say):
then torchrun ends the launch, and its agent names that worker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.launch import _handed_over, _Supervisor
from tests.train.conftest import data_dir, init_dir  # noqa: F401 (fixtures)
from tests.train.launching import RUN

pytestmark = pytest.mark.distributed

# Put first on the workers' PYTHONPATH: the rank LCFT_TEST_RANK reads its --init at LCFT_TEST_INIT instead, as
# a node whose copy of that path holds another model would (each rank then finds what it finds on its own).
OTHER_INIT_ON_ONE_RANK = """
import dataclasses, os
if os.environ.get("RANK") == os.environ["LCFT_TEST_RANK"]:
    import lcft.train.config as config
    _load = config.load_run_config
    config.load_run_config = lambda path: dataclasses.replace(_load(path), init=os.environ["LCFT_TEST_INIT"])
"""


@pytest.fixture(scope="module")
def other_tokenizer(init_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The small model with another tokenizer than the data's (lower-case bases in its vocabulary)."""
    out = tmp_path_factory.mktemp("other") / "model"
    shutil.copytree(init_dir, out)
    meta = json.loads((out / "lcft.json").read_text())
    meta["tokenizer"]["vocab"][4:8] = ["a", "c", "g", "t"]
    (out / "lcft.json").write_text(json.dumps(meta))
    return out


def _alone(data: Path, init: Path, out: Path) -> str:
    """The error line of the same command in one process (the oracle)."""
    r = CliRunner().invoke(app, ["train", "--data", str(data), "--init", str(init), "--out", str(out), *RUN,
                                 "--steps", "1"])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.output
    return r.stderr.strip()


@pytest.mark.parametrize("rank", ["every", "0", "1"])
def test_a_user_error_found_in_the_workers_is_one_line(tmp_path, data_dir, init_dir, other_tokenizer,  # noqa: F811
                                                       rank):
    expected = _alone(data_dir, other_tokenizer, tmp_path / "alone")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(OTHER_INIT_ON_ONE_RANK)
    path = os.pathsep.join([str(hook), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])
    init = other_tokenizer if rank == "every" else init_dir
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "lcft", "train", "--data", str(data_dir), "--init", str(init),
                        "--out", str(out), *RUN, "--steps", "1", "--nproc", "2"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, LCFT_TEST_RANK=rank,
                                LCFT_TEST_INIT=str(other_tokenizer)))
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr == expected + "\n" and r.stdout == "", (r.stdout[-3000:], r.stderr[-3000:])
    assert not out.exists() and not (tmp_path / "alone").exists()


def test_a_missing_init_answers_before_the_launch(tmp_path, data_dir, monkeypatch):  # noqa: F811
    """--init is found before any process starts: the error of one process, and no run folder. A resume trains
    its checkpoint's model and does not read --init: its own error comes instead."""
    def args(out: Path) -> list[str]:
        return ["train", "--data", str(data_dir), "--init", str(tmp_path / "missing"), "--out", str(out), *RUN,
                "--nproc", "2"]

    resumed = CliRunner().invoke(app, [*args(tmp_path / "resumed"), "--resume", "auto"])  # (the launch refuses it)
    assert resumed.exit_code == 1 and resumed.stderr.startswith("error: --resume auto: no checkpoint in "), \
        resumed.output
    assert not (tmp_path / "resumed").exists()

    def no_launch(*_args):
        raise AssertionError("launched")

    monkeypatch.setattr("lcft.launch.launch", no_launch)
    alone = CliRunner().invoke(app, args(tmp_path / "new" / "run")[:-2])
    r = CliRunner().invoke(app, args(tmp_path / "new" / "run"))
    assert alone.exit_code == r.exit_code == 1 and r.stderr == alone.stderr, (alone.output, r.output, r.exception)
    assert r.stderr == f"error: checkpoint not found: {tmp_path / 'missing'} (give a checkpoint, a run or an HF " \
                       "model folder)\n"
    assert not (tmp_path / "new").exists()


def test_rank_0s_error_is_raised_else_the_first_ones(tmp_path):
    for rank, when in [(3, 1), (1, 2), (2, 2)]:
        (tmp_path / str(rank)).write_text(f"from rank {rank}\n")
        os.utime(tmp_path / str(rank), ns=(when, when))
    (tmp_path / ".0.tmp").write_text("being written")  # (atomic_write's temp file)
    assert [(r, m) for r, _, m in _handed_over(tmp_path)] == [(3, "from rank 3"), (1, "from rank 1"),
                                                              (2, "from rank 2")]
    (tmp_path / "0").write_text("from rank 0")
    assert _handed_over(tmp_path)[0][::2] == (0, "from rank 0")


# Stands in for torchrun's agent: two workers, of which argv[1] still run when both ranks have handed over a user
# error (the others ended before: the OOM killer's SIGKILL, reaped as the agent reaps); it exits as they do.
FAKE_AGENT = """
import pathlib, subprocess, sys
running, errors = int(sys.argv[1]), pathlib.Path(sys.argv[2])
workers = [subprocess.Popen(["sleep", "30" if running == 2 else "1"]) for _ in range(2)]
for w in workers[running:]:
    w.kill()
    w.wait()
for rank in (1, 0):
    (errors / str(rank)).write_text(f"rank {rank}'s error")
sys.exit(max(w.wait() for w in workers[:running]) or 1)
"""


@pytest.mark.parametrize("running", [2, 1])
def test_a_user_error_ends_the_launch_unless_a_worker_had_ended(tmp_path, running):
    errors = tmp_path / "errors"
    errors.mkdir()
    supervisor = _Supervisor([sys.executable, "-c", FAKE_AGENT, str(running), str(errors)], dict(os.environ),
                             tmp_path / "failure.txt", errors, 2, elastic=False, resume="")
    rc = supervisor.run()
    assert supervisor.heard == "rank 0's error"
    if running == 2:  # every worker ended at once (killed before its sleep ended), rank 0's error raised
        assert supervisor.ended and supervisor.said == "rank 0's error" and rc == -9
    else:  # torchrun's to end: the agent exited as its workers did, and the error may be the ended one's consequence
        assert not supervisor.ended and supervisor.said is None and rc == 1
        assert list(errors.iterdir()) == []  # heard: a restarted group's errors come anew
