"""What a run's fingerprint holds (lcft.train.run_dir.same_run): --data and --init compared by content, so a node's
own copy at another path is the same run and a copy of other windows or another model is not; the options as the
run takes them, so one run given two ways is one run. And the run folder as a start takes it: a step a failed save
left aside is back before --resume auto chooses."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.layout import list_checkpoints, step_name
from lcft.checkpoint.save import write_checkpoint
from lcft.checkpoint.state import read_trainer_state
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.liveness import RESTART_ENV
from lcft.train import TrainConfig, train
from lcft.train.precision import choose_precision
from lcft.train.run_dir import check_run_folder, same_run
from tests.parallel.harness import run_ranks
from tests.parallel.workers import train_same_run_checks
from tests.train.conftest import WINDOW
from tests.train.launching import RUN


def test_a_copy_of_the_inputs_elsewhere_is_the_same_run_and_other_windows_are_not(tmp_path, data_dir, init_dir):
    base = dict(out=str(tmp_path / "run"), seq_len=512)
    node0 = same_run(TrainConfig(data=str(data_dir), init=str(init_dir), **base))
    data, init = shutil.copytree(data_dir, tmp_path / "data"), shutil.copytree(init_dir, tmp_path / "init")
    assert same_run(TrainConfig(data=str(data), init=str(init), **base)) == node0
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["files"]["train.bin"]["sha256"] = "0" * 64  # windows prepared otherwise
    (data / "manifest.json").write_text(json.dumps(manifest))
    (init / "config.json").write_text((init / "config.json").read_text() + " ")  # another model's files
    other = same_run(TrainConfig(data=str(data), init=str(init), **base))
    assert {k for k in node0 if other[k] != node0[k]} == {"data", "init"}
    assert same_run(TrainConfig(data=str(tmp_path / "none"), **base))["data"] == "unreadable"


def _checksums_id(ckpt: Path) -> str:
    """The oracle of a checkpoint's identity: the sha256 of its checksums file's sha256 as JSON, 16 hex digits."""
    listed = hashlib.sha256((ckpt / "checksums.json").read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:16]


@pytest.mark.distributed
def test_one_run_given_two_ways_is_the_same_run_and_another_run_is_not(tmp_path, data_dir, init_dir,
                                                                        one_process_run):
    """Two ranks (two nodes), each giving one run its own way, pass the same-run check: --seq-len unset and the
    data's window length; --precision auto and what it picks here; --preset beside --init (which ignores it); the
    model's attention and RoPE options unset and given as --init's model has them; one --rope-scaling spelled two
    ways (a factor of 8 and 8.0, keys in another order, 'type' for 'rope_type', the original length its type takes
    by default left out and given); --stop-after unset and at or past --steps, or past the steps left after the checkpoint resumed (it stops
    nothing); the window
    split's options without cp (nothing split); --resume auto and the checkpoint it resumes (given with --init and
    --preset, which a resume ignores, and --rope-theta as the checkpoint's model has it). Each was named another
    run. Another --seq-len, --rope-scaling factor and --stop-after that stops the run early, and --resume auto in a
    run folder whose latest checkpoint is another, still are."""
    base = dict(data=str(data_dir), init=str(init_dir), out=str(tmp_path / "run"), seq_len=512, precision="fp32")
    auto = choose_precision("auto", not torch.cuda.is_available())[0]
    latest = one_process_run / "checkpoints" / step_name(6)
    resume = {**base, "out": str(one_process_run), "resume": "auto"}
    at4 = {**base, "resume": str(one_process_run / "checkpoints" / step_name(4)), "init": None, "steps": 6}
    behind = shutil.copytree(one_process_run, tmp_path / "behind")  # a node whose run folder holds steps 2 and 4
    shutil.rmtree(behind / "checkpoints" / step_name(6))
    same = [
        [{**base, "seq_len": None}, {**base, "seq_len": WINDOW}],
        [{**base, "precision": "auto"}, {**base, "precision": auto}],
        [base, {**base, "preset": "small"}],
        [base, {**base, "rope_theta": 1e6, "attention": "dense", "block_size": 64, "top_k": 16}],
        [{**base, "rope_scaling": "yarn:8:65536"}, {**base, "rope_scaling": "YARN:8.0:64K"}],
        [{**base, "rope_scaling": '{"rope_type": "yarn", "factor": 8}'},
         {**base, "rope_scaling": '{"factor": 8.0, "type": "yarn"}'}],
        # --init's model: max_position_embeddings 1M, yarn's original length when none is given
        [{**base, "rope_scaling": "yarn:8"},
         {**base, "rope_scaling": '{"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 1048576}'}],
        [{**base, "steps": 6}, {**base, "steps": 6, "stop_after": 6}],
        [{**base, "steps": 6}, {**base, "steps": 6, "stop_after": 1000}],
        [base, {**base, "cp_kv": "stream", "cp_layout": "contiguous"}],
        [{**resume, "preset": "small"}, {**resume, "resume": str(latest), "init": None, "rope_theta": 1e6}],
        [at4, {**at4, "stop_after": 2}],
    ]
    other = [[{**base, "seq_len": None}, {**base, "seq_len": 1024}], [resume, {**resume, "out": str(behind)}],
             [{**base, "rope_scaling": "linear:8"}, {**base, "rope_scaling": "linear:8.5"}],
             [{**base, "steps": 6}, {**base, "steps": 6, "stop_after": 5}], [at4, {**at4, "stop_after": 1}]]
    got = run_ranks(train_same_run_checks, 2, same + other)
    assert got[0] == got[1]
    options, inputs = "(give every node the same options)", "(give every node the same data and checkpoints, at " \
        "whatever path)"
    assert got[0] == [None] * len(same) + [
        f"node 1 runs another run than node 0: seq_len 1024 vs {WINDOW} {options}",
        f"node 1 runs another run than node 0: resume {_checksums_id(behind / 'checkpoints' / step_name(4))} vs "
        f"{_checksums_id(latest)} {inputs}",
        'node 1 runs another run than node 0: rope_scaling {"factor": 8.5, "rope_type": "linear"} vs {"factor": 8, '
        f'"rope_type": "linear"}} {options}',
        f"node 1 runs another run than node 0: stop_after 5 vs None {options}",
        f"node 1 runs another run than node 0: stop_after 1 vs None {options}"]


def _set_aside(run: Path, step: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`run`'s checkpoint of `step` as a save of that step again leaves it where the file system renamed it aside
    and then refused to rename either copy to its name: marked, for the next start to put back."""
    final, real = run / "checkpoints" / step_name(step), os.rename

    def fuse(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        if Path(dst) == final:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        real(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "rename", fuse)
        with pytest.raises(LcftError, match="cannot rename it back"):
            write_checkpoint(run, step, lambda d: shutil.copytree(final, d, dirs_exist_ok=True), lambda d: None)
    [aside] = (run / "checkpoints").glob(".tmp-old-*")
    return aside


def test_resume_auto_resumes_from_a_step_a_failed_save_left_aside(tmp_path, base_cfg, monkeypatch):
    """Steps 1 and 2 saved; saving step 2 again left it aside, marked. `lcft train --resume auto` puts it back
    before it chooses, and resumes from step 2. It resumed from step 1, then put step 2 back and moved it to
    superseded/ as a step after the one resumed."""
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 2, "save_every": 1, "keep_last": 0}))
    aside = _set_aside(run, 2, monkeypatch)
    assert [p.name for _, p in list_checkpoints(run)] == [step_name(1)]
    r = CliRunner().invoke(app, ["train", "--data", base_cfg["data"], "--out", str(run), "--resume", "auto",
                                 "--steps", "3", "--seq-len", "512", "--global-batch", "2", "--precision", "fp32",
                                 "--warmup", "2", "--lr", "1e-3", "--no-progress"])
    assert r.exit_code == 0, r.output
    ckpt = run / "checkpoints" / step_name(2)
    assert f"{step_name(2)}, replaced by a save that failed, is back in place" in r.output
    assert f"resumed from {ckpt} (step 2, 1 process(es))" in r.output, r.output
    assert not (run / "superseded").exists() and not aside.exists()
    assert [p.name for _, p in list_checkpoints(run)] == [step_name(s) for s in (1, 2, 3)]
    assert read_trainer_state(run / "checkpoints" / step_name(3))[0].step == 3


def test_a_restarted_group_resumes_a_step_a_failed_save_left_aside(tmp_path, base_cfg, monkeypatch, capfd):
    """Step 1 saved, then left aside by a save of it again, and the process died: the group its agent restarts
    (told no --resume at first) continues from step 1, put back before it looks for the latest checkpoint."""
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 1, "save_every": 1, "keep_last": 0}))
    _set_aside(run, 1, monkeypatch)
    monkeypatch.setenv(RESTART_ENV, "1")
    capfd.readouterr()
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 1, "save_every": 1, "keep_last": 0}))
    said = "".join(capfd.readouterr())
    assert f"resumed from {run / 'checkpoints' / step_name(1)} (step 1" in said, said
    assert [p.name for _, p in list_checkpoints(run)] == [step_name(1)]


def test_a_launch_puts_back_its_only_checkpoint_before_it_looks_for_one(tmp_path, base_cfg, monkeypatch, capfd):
    """Step 1 saved, then left aside by a save of it again: the only checkpoint of the run. A launch's check of the
    run folder (check_run_folder, under its lock, before any process starts) puts it back and finds it; it
    refused the launch with '--resume auto: no checkpoint' (one process put it back itself)."""
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 1, "save_every": 1, "keep_last": 0}))
    aside = _set_aside(run, 1, monkeypatch)
    assert list_checkpoints(run) == []
    check_run_folder(TrainConfig(out=str(run), resume="auto", **{**base_cfg, "steps": 2}))
    assert [p.name for _, p in list_checkpoints(run)] == [step_name(1)] and not aside.exists()
    assert f"{step_name(1)}, replaced by a save that failed, is back in place" in capfd.readouterr().err


# Put first on the workers' PYTHONPATH: rank 1 reads the launch's config with the options LCFT_TEST_SPELLING
# (JSON) replaced, as a node given the run another way would.
SPELLED_ON_RANK_1 = """
import dataclasses, json, os
if os.environ.get("RANK") == "1":
    import lcft.train.config as config
    _load = config.load_run_config
    config.load_run_config = lambda path: dataclasses.replace(_load(path), **json.loads(os.environ["LCFT_TEST_SPELLING"]))
"""


@pytest.mark.distributed
def test_two_ranks_given_one_run_two_ways_train_it_to_the_end(tmp_path, data_dir, init_dir):
    """`lcft train --nproc 2` where rank 1 is given --preset small beside --init (ignored), the model's own
    attention and RoPE, and --stop-after the run's --steps (it stops nothing); then --resume auto where rank 1 is given the checkpoint it resumes, without --init: both
    launches train to the end, exit 0 (each was 'rank 1 runs another run than rank 0', exit 1)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SPELLED_ON_RANK_1)
    path = os.pathsep.join([str(hook), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])
    run = tmp_path / "run"

    def launch(spelling: dict, *args: str) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, LCFT_TEST_SPELLING=json.dumps(spelling))
        r = subprocess.run([sys.executable, "-m", "lcft", "train", "--data", str(data_dir), "--init", str(init_dir),
                            "--out", str(run), *RUN, "--nproc", "2", *args], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]

    launch({"preset": "small", "rope_theta": 1e6, "attention": "dense", "block_size": 64, "stop_after": 1},
           "--steps", "1")
    launch({"resume": str(run / "checkpoints" / step_name(1)), "init": None}, "--steps", "2", "--resume", "auto")
    assert [s for s, _ in list_checkpoints(run)] == [1, 2]
