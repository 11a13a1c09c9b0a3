"""A user error found inside the processes of `lcft train --nproc 2`, as a terminal shows it: one `error:` line, the
one the same command prints without --nproc, exit 1, no traceback from any rank, no C++ stack trace of the others
torn out of their collectives, torchrun's agent silent, and no run folder. Found by every rank, by rank 0 only (its
end took the run's store with it), or by rank 1 only (rank 0 said nothing). The launcher's choice: rank 0's error,
else the first; none when a worker of the node had already ended (killed by the OOM killer, say): then torchrun ends
the launch, and its agent names that worker. A stop signal while the launcher waits for the other ranks' errors ends
on the error; an error after the other ranks finished their work ends the launch at once, without a restart; an
error's own exit code is the launch's, and, with no launcher to hand it to, each worker's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.config_toml import save_resolved, to_dict
from lcft.launch.__main__ import HAND_OVER_S
from lcft.launch.process import hand_over, handed_over
from lcft.launch.supervisor import Supervisor
from lcft.liveness import EXIT_LOST
from lcft.train import TrainConfig
from lcft.train.config import resolve_folders
from tests.train.conftest import data_dir, init_dir  # noqa: F401 (fixtures)
from tests.train.launching import RUN, error_lines, free_port, start_worker

pytestmark = pytest.mark.distributed

# Put first on the workers' PYTHONPATH: the rank LCFT_TEST_RANK reads its --init at LCFT_TEST_INIT instead, as
# a node whose copy of that path holds another model would (each rank then finds what it finds on its own).
# The rank(s) LCFT_TEST_RANK names read another --init than the launch gave: a user error only they find, as they
# read the model. They still give the launch's --init to the nodes' same-run check (lcft.parallel.same_run), which
# would otherwise find the difference first, on every rank.
OTHER_INIT_ON_ONE_RANK = """
import dataclasses, os
if os.environ.get("RANK") == os.environ["LCFT_TEST_RANK"]:
    import lcft.train.config as config
    import lcft.train.trainer as trainer
    _load, _same_run, given = config.load_run_config, trainer.same_run, {}
    def _other_init(path):
        cfg = _load(path)
        given["init"] = cfg.init
        return dataclasses.replace(cfg, init=os.environ["LCFT_TEST_INIT"])
    config.load_run_config = _other_init
    trainer.same_run = lambda cfg: _same_run(dataclasses.replace(cfg, init=given["init"]))
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


def _hooked(tmp_path: Path, hook: str, **env: str) -> dict[str, str]:
    """The environment of a command whose processes run `hook` as their sitecustomize, `env` added."""
    folder = tmp_path / "hook"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(hook)
    path = os.pathsep.join([str(folder), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, **env)


def _train(data: Path, init: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "lcft", "train", "--data", str(data), "--init", str(init), "--out", str(out), *RUN,
            "--steps", "1", *args]


@pytest.mark.parametrize("rank", ["every", "0", "1"])
def test_a_user_error_found_in_the_workers_is_one_line(tmp_path, data_dir, init_dir, other_tokenizer,  # noqa: F811
                                                       rank):
    expected = _alone(data_dir, other_tokenizer, tmp_path / "alone")
    init = other_tokenizer if rank == "every" else init_dir
    out = tmp_path / "run"
    r = subprocess.run(_train(data_dir, init, out, "--nproc", "2"), capture_output=True, text=True, timeout=300,
                       env=_hooked(tmp_path, OTHER_INIT_ON_ONE_RANK, LCFT_TEST_RANK=rank,
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


def test_rank_0s_error_is_raised_else_the_first_ones(tmp_path, monkeypatch):
    """Of the latest round only: a restarted group's ranks hand over anew."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    for rank, when in [(3, 1), (1, 2), (2, 2), (4, 0)]:
        hand_over(tmp_path, rank, 0 if rank == 4 else 75, "" if rank == 4 else f"from rank {rank}")
        os.utime(tmp_path / str(rank), ns=(when, when))
    (tmp_path / ".0.tmp").write_text("being written")  # (atomic_write's temp file)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    hand_over(tmp_path, 0, 1, "from rank 0 before the restart")
    assert [(h.rank, h.exit_code, h.message) for h in handed_over(tmp_path)] == [
        (4, 0, ""), (3, 75, "from rank 3"), (1, 75, "from rank 1"), (2, 75, "from rank 2")]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    hand_over(tmp_path, 0, 1, "from rank 0")
    assert handed_over(tmp_path)[0][:4] == (0, 1, 1, "from rank 0")


# Stands in for torchrun's agent: two workers, of which argv[1] still run when both ranks have handed over a user
# error (the others ended before: the OOM killer's SIGKILL, reaped as the agent reaps); it exits as they do.
FAKE_AGENT = """
import pathlib, subprocess, sys
from lcft.launch.process import hand_over
running, errors = int(sys.argv[1]), pathlib.Path(sys.argv[2])
workers = [subprocess.Popen(["sleep", "30" if running == 2 else "1"]) for _ in range(2)]
for w in workers[running:]:
    w.kill()
    w.wait()
for rank in (1, 0):
    hand_over(errors, rank, 1, f"rank {rank}'s error")
sys.exit(max(w.wait() for w in workers[:running]) or 1)
"""


@pytest.mark.parametrize("running", [2, 1])
def test_a_user_error_ends_the_launch_unless_a_worker_had_ended(tmp_path, running):
    errors = tmp_path / "errors"
    errors.mkdir()
    supervisor = Supervisor([sys.executable, "-c", FAKE_AGENT, str(running), str(errors)], dict(os.environ),
                            tmp_path / "failure.txt", errors, 2, elastic=False, resume="")
    rc = supervisor.run()
    assert supervisor.heard is not None and supervisor.heard.message == "rank 0's error"
    if running == 2:  # every worker ended at once (killed before its sleep ended), rank 0's error raised
        assert supervisor.ended and supervisor.said == supervisor.heard and rc == -9
    else:  # torchrun's to end: the agent exited as its workers did, and the error may be the ended one's consequence
        assert not supervisor.ended and supervisor.said is None and rc == 1
        assert list(errors.iterdir()) == []  # heard: a restarted group's errors come anew


# Stands in for torchrun's agent: three workers; rank 1 is SIGKILLed before its work is done (the OOM killer), rank 2
# hands over "finished" and is still tearing down, rank 0 hands over a user error (the consequence of rank 1's end).
DEAD_AND_FINISHING_AGENT = """
import pathlib, subprocess, sys, time
errors = sys.argv[1]
def worker(rank, code, message):
    return subprocess.Popen([sys.executable, "-c", "import sys, time; from lcft.launch.process import hand_over; "
                             f"hand_over({errors!r}, {rank}, {code}, {message!r}); time.sleep(6)"])
dead = subprocess.Popen(["sleep", "30"])
dead.kill()
dead.wait()
finishing = worker(2, 0, "")
while not (pathlib.Path(errors) / "2").exists():
    time.sleep(0.01)
erring = worker(0, 1, "rank 0's error")
time.sleep(5)
sys.exit(1)
"""


def test_a_finished_rank_still_running_is_not_counted_twice(tmp_path):
    """A worker that ended before its work was done is not covered by one that finished and is still running:
    rank 0's error may be the dead one's consequence, so torchrun ends the launch (naming the dead worker)."""
    errors = tmp_path / "errors"
    errors.mkdir()
    supervisor = Supervisor([sys.executable, "-c", DEAD_AND_FINISHING_AGENT, str(errors)], dict(os.environ),
                            tmp_path / "failure.txt", errors, 3, elastic=False, resume="")
    rc = supervisor.run()
    assert supervisor.heard is not None and supervisor.heard.message == "rank 0's error"
    assert not supervisor.ended and supervisor.said is None and rc == 1


def test_a_stop_signal_after_a_rank_handed_over_its_user_error_ends_on_that_error(  # noqa: F811
        tmp_path, data_dir, init_dir, other_tokenizer):  # noqa: F811
    """Ctrl-C while the launcher gives the other rank its grace to raise the same error (rank 1 never does: it
    waits in a collective): the error, the cause, is what the launch ends on, not the stop."""
    expected = _alone(data_dir, other_tokenizer, tmp_path / "alone")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "run"
    launcher = subprocess.Popen(_train(data_dir, init_dir, out, "--nproc", "2"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=_hooked(tmp_path, OTHER_INIT_ON_ONE_RANK, LCFT_TEST_RANK="0",
                                            LCFT_TEST_INIT=str(other_tokenizer), TMPDIR=str(tmp_path / "tmp")))
    deadline = time.monotonic() + 240
    while not list((tmp_path / "tmp").glob("lcft-launch-*/handed/0")):  # rank 0 handed its error over
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.01)
    launcher.send_signal(signal.SIGINT)
    stdout, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 1, stderr[-3000:]
    assert stderr == expected + "\n" and stdout == "", (stdout[-3000:], stderr[-3000:])
    assert not out.exists()


# Rank 0 of a launch, and a process started without one, find the disk full as they write summary.json, rank 0
# once the node's other ranks have exited (their work done); each time is counted in LCFT_TEST_FULL.
FULL_DISK_AT_SUMMARY = """
import errno, os, time
import psutil
import lcft.files as files
_write = files.atomic_write
def _running(p):
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
def atomic_write(path, *args, **kwargs):
    if os.path.basename(path) != "summary.json" or os.environ.get("RANK", "0") != "0":
        return _write(path, *args, **kwargs)
    me, deadline = psutil.Process(), time.monotonic() + 60
    while "RANK" in os.environ and time.monotonic() < deadline and any(
            _running(p) for p in me.parent().children() if p.pid != me.pid):
        time.sleep(0.05)
    with open(os.environ["LCFT_TEST_FULL"], "a") as f:
        f.write(f"{time.time()}\\n")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
files.atomic_write = atomic_write
"""


def test_a_user_error_after_the_other_ranks_finished_ends_the_launch_at_once(tmp_path, data_dir, init_dir):  # noqa: F811
    """Rank 1 trained its step and exited 0; then rank 0 finds the disk full writing summary.json. The launch
    ends on that error at once (not after the rank's own wait), and is not restarted (it would fail the same)."""
    alone = tmp_path / "alone"
    env = _hooked(tmp_path, FULL_DISK_AT_SUMMARY, LCFT_TEST_FULL=str(tmp_path / "full.txt"))
    r = subprocess.run(_train(data_dir, init_dir, alone), capture_output=True, text=True, timeout=300, env=env)
    # (its one error line after the run's notes: --steps 1 never leaves the warm-up, which a note says)
    assert r.returncode == 1 and error_lines(r.stderr) == [r.stderr.splitlines()[-1]], r.stderr[-3000:]
    assert error_lines(r.stderr)[0].startswith("error: no space left on the device of "), r.stderr[-3000:]
    expected = r.stderr.replace(str(alone), str(tmp_path / "run"))
    (tmp_path / "full.txt").unlink()
    r = subprocess.run(_train(data_dir, init_dir, tmp_path / "run", "--nproc", "2", "--max-restarts", "1"),
                       capture_output=True, text=True, timeout=300, env=env)
    ended = time.time()
    full = (tmp_path / "full.txt").read_text().split()
    assert len(full) == 1, f"rank 0 found the disk full {len(full)} times: restarted"
    assert r.returncode == 1, r.stderr[-3000:]
    free = re.compile(r", [^,]* free$", re.M)  # (what the disk had free then)
    assert free.sub("", r.stderr) == free.sub("", expected) and r.stdout == "", (r.stdout[-3000:], r.stderr[-3000:])
    assert ended - float(full[0]) < HAND_OVER_S / 2  # ended by the launcher, not by the rank's own wait


# Every rank of a launch, and a process started without one, raise a user error with its own exit code (75).
PEER_LOST_AT_START = """
import lcft.genomics.shards as shards
from lcft.liveness import PeerLost
def verify_windows(*args, **kwargs):
    raise PeerLost("the store of rank 3 stopped answering (as the test says)")
shards.verify_windows = verify_windows
"""


@pytest.fixture(scope="module")
def peer_lost(tmp_path_factory: pytest.TempPathFactory, data_dir: Path,  # noqa: F811
              init_dir: Path) -> tuple[dict[str, str], subprocess.CompletedProcess]:  # noqa: F811
    """The environment of commands whose processes raise PEER_LOST_AT_START's error, and one process's run in it
    (the oracle): exit 75 and one line."""
    tmp = tmp_path_factory.mktemp("peer-lost")
    env = _hooked(tmp, PEER_LOST_AT_START)
    alone = subprocess.run(_train(data_dir, init_dir, tmp / "alone"), capture_output=True, text=True, timeout=300,
                           env=env)
    assert alone.returncode == EXIT_LOST and alone.stderr.count("\n") == 1, alone.stderr[-3000:]
    return env, alone


def test_a_user_errors_own_exit_code_is_the_launchs(tmp_path, data_dir, init_dir, peer_lost):  # noqa: F811
    env, alone = peer_lost
    r = subprocess.run(_train(data_dir, init_dir, tmp_path / "run", "--nproc", "2"), capture_output=True, text=True,
                       timeout=300, env=env)
    assert (r.returncode, r.stderr, r.stdout) == (EXIT_LOST, alone.stderr, ""), r.stderr[-3000:]


def test_a_user_errors_own_exit_code_is_the_workers_without_a_hand_over(tmp_path, data_dir, init_dir,  # noqa: F811
                                                                        peer_lost):
    """Workers with no launcher to hand their error to (no hand-over folder: several nodes with --max-restarts,
    whose agents restart the group and record how each worker ended): each exits with the error's own code (75),
    rank 0 printing the one line one process prints."""
    env, alone = peer_lost
    cfg = TrainConfig(data=str(data_dir), init=str(init_dir), out=str(tmp_path / "run"), seq_len=512, steps=1,
                      global_batch=2, precision="fp32", progress=False, nproc=2)
    spec = save_resolved(tmp_path / "spec.toml", to_dict(resolve_folders(cfg)))
    port = free_port()
    ranks = [start_worker(spec, rank, 2, port, env={"PYTHONPATH": env["PYTHONPATH"]}) for rank in (0, 1)]
    try:
        (_, err0), (_, err1) = ranks[0].communicate(timeout=240), ranks[1].communicate(timeout=240)
    finally:
        for p in ranks:
            p.kill()
    assert [p.returncode for p in ranks] == [EXIT_LOST, EXIT_LOST], err0[-3000:] + err1[-3000:]
    assert err0 == alone.stderr, err0[-3000:]
    # Rank 1 says nothing, or, still in a collective when rank 0 (serving the store) ended, that rank 0 stopped
    # answering (seen under a loaded machine; before rank 0's record was read: "rank 0 (host H), which serves the
    # run's store ..."): never its own copy of the error
    said = error_lines(err1)
    assert said == [] or (len(said) == 1 and said[0].startswith("error: rank 0 ") and "stopped answering" in said[0]
                          and "pid 0" not in said[0]), err1
