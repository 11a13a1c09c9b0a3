"""A run folder used again with other options or other data: a folder without checkpoints takes a new run; a
resume names data re-prepared under the same path, and keeps the run's own --init and --preset (ignored there)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.layout import STATE_DIR, list_checkpoints
from lcft.checkpoint.save import write_checksums
from lcft.checkpoint.state import TrainerState
from lcft.config_toml import load_toml, save_resolved, to_dict
from lcft.errors import LcftError
from lcft.genomics import prepare_windows, sample_fasta
from lcft.train import TrainConfig, TrainHooks, latest_checkpoint, train
from lcft.train.metrics import read_metrics
from lcft.train.run_dir import keep_resumed_model, record_data
from tests.one_line import one_line
from tests.test_files import plant

from .conftest import WINDOW
from .test_resume import assert_same_run


class Crash(Exception):
    """Ends a run between two steps, as a kill would: no checkpoint written."""


def _crash_at(step: int) -> TrainHooks:
    def before(s: int) -> None:
        if s == step:
            raise Crash

    return TrainHooks(before_step=before)


def _lines(capsys: pytest.CaptureFixture, words: str) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if words in line]


def test_a_folder_without_checkpoints_takes_a_new_run_with_other_options(tmp_path, base_cfg, capsys):
    run = tmp_path / "run"
    with pytest.raises(Crash):
        train(TrainConfig(out=str(run), **{**base_cfg, "save_every": 4}), _crash_at(3))
    assert latest_checkpoint(run) is None and len(read_metrics(run)) == 2
    capsys.readouterr()

    changed = {**base_cfg, "lr": 5e-4}
    s = train(TrainConfig(out=str(run), **changed))
    said = _lines(capsys, "nothing to resume")
    assert len(said) == 1 and "lr: 0.001 -> 0.0005" in said[0] and "replaces its config.toml" in said[0]
    assert s["step"] == 6 and load_toml(run / "config.toml")["lr"] == 5e-4
    fresh = train(TrainConfig(out=str(tmp_path / "fresh"), **changed))  # the same options in a new folder
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in read_metrics(run)] == [r["loss"] for r in read_metrics(tmp_path / "fresh")]
    assert s["loss"] == fresh["loss"]


def _prepare(out: Path, **options) -> str:
    """Windows of the bundled sample at `out` (replacing what is there); the sha256 of their train.bin."""
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=WINDOW, train=("chr2",), eval=("chr22",),
                    overwrite=True, **options)
    return hashlib.sha256((out / "train.bin").read_bytes()).hexdigest()


def test_resume_names_data_prepared_again_under_the_same_path(tmp_path, base_cfg, capsys):
    data = tmp_path / "data"
    first = _prepare(data)
    cfg = {**base_cfg, "data": str(data), "steps": 2, "save_every": 2}
    train(TrainConfig(out=str(tmp_path / "run"), **cfg))
    older = tmp_path / "older"  # a checkpoint of an lcft that did not record its data
    shutil.copytree(tmp_path / "run", older)
    state = latest_checkpoint(older) / STATE_DIR / "state.json"
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "data"}))
    write_checksums(latest_checkpoint(older))

    train(TrainConfig(out=str(tmp_path / "same"), **{**cfg, "steps": 1}))
    capsys.readouterr()
    train(TrainConfig(out=str(tmp_path / "same"), resume="auto", **cfg))  # the same data: nothing said
    assert not _lines(capsys, "data contents")

    second = _prepare(data, stride=WINDOW // 2)
    assert second != first
    s = train(TrainConfig(out=str(tmp_path / "run"), resume="auto", **{**cfg, "steps": 3}))
    said = _lines(capsys, "resuming with changed options")
    assert len(said) == 1 and s["step"] == 3
    assert f"stride {WINDOW} -> {WINDOW // 2}" in said[0]
    assert f"train.bin sha256 {first[:12]} -> {second[:12]}" in said[0]

    s = train(TrainConfig(out=str(older), resume="auto", **{**cfg, "steps": 3}))
    assert s["step"] == 3 and not _lines(capsys, "data contents")


@pytest.mark.parametrize(("started", "given", "said"), [
    ({"init": "/m/init"}, {"preset": "small"}, "from a run started with --init '/m/init'): --preset 'small'"),
    ({"preset": "small"}, {"init": "/m/other"}, "from a run started with --preset 'small'): --init '/m/other'"),
    ({"init": "/m/init"}, {"init": "/m/other", "preset": "base"},
     "from a run started with --init '/m/init'): --init '/m/other'; --preset 'base'"),
])
def test_options_ignored_on_resume_name_what_the_run_started_from(tmp_path, started, given, said):
    """The line names the run's own start, --init or --preset: a run given --init saved the default preset
    'tiny' beside it, which it never used (the line said "--preset 'small' (the run's: 'tiny')" of it)."""
    save_resolved(tmp_path / "config.toml", to_dict(TrainConfig(**started)))
    lines: list[str] = []
    kept = keep_resumed_model(TrainConfig(**given), tmp_path, lines.append)
    assert lines == [f"ignored with --resume (the model is the checkpoint's, {said}"]
    assert (kept.init, kept.preset) == (started.get("init"), started.get("preset", "tiny"))



def test_a_resumed_checkpoints_config_toml_that_is_no_file_is_one_line(tmp_path):
    """A checkpoint's config.toml there but no regular file (a FIFO) was read as none: the options a resume keeps
    from the run were the ones given."""
    path = plant(tmp_path / "config.toml", "FIFO")
    one_line(lambda: keep_resumed_model(TrainConfig(preset="small"), tmp_path, print), f"{path} is a FIFO")

def test_options_ignored_on_resume_keep_the_runs_values(tmp_path, base_cfg, init_dir, capsys):
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 2, "save_every": 2}))
    straight = tmp_path / "straight"
    shutil.copytree(run, straight)
    other = tmp_path / "other-init"
    shutil.copytree(init_dir, other)
    capsys.readouterr()

    s = train(TrainConfig(out=str(run), resume="auto", **{**base_cfg, "init": str(other), "preset": "small",
                                                           "steps": 3}))
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "ignored with --resume" in line]
    assert len(said) == 1 and "'small'" in said[0] and str(other) in said[0], out
    changed = [line for line in out.splitlines() if "resuming with changed options" in line]
    assert changed and "preset" not in changed[0] and "init" not in changed[0]
    for config in (run / "config.toml", Path(s["checkpoint"]) / "config.toml"):
        saved = load_toml(config)
        assert (saved["init"], saved.get("preset", "tiny")) == (str(init_dir), "tiny"), config

    # without --init: the run's is kept, and nothing is said (not given is not a change)
    s2 = train(TrainConfig(out=str(straight), resume="auto", **{**base_cfg, "init": None, "steps": 3}))
    assert not _lines(capsys, "ignored with --resume")
    assert load_toml(Path(s2["checkpoint"]) / "config.toml")["init"] == str(init_dir)
    assert s["loss"] == s2["loss"]  # the same model went on both times
    torch.testing.assert_close(torch.tensor([r["loss"] for r in read_metrics(run)]),
                               torch.tensor([r["loss"] for r in read_metrics(straight)]), rtol=0, atol=0)


class Hung(Exception):
    """The run blocked (reading a FIFO waits for a writer that never comes)."""


def _hung(signum: int, frame: object) -> None:
    raise Hung


@pytest.mark.parametrize("name,kind", [("metrics.jsonl", "fifo"), ("metrics.jsonl", "folder"),
                                       ("config.toml", "folder"), ("summary.json", "folder"),
                                       ("metrics.jsonl", "dangling link"), ("metrics.jsonl", "link")])
def test_a_run_file_that_is_not_a_file_is_one_line_before_anything_is_written(tmp_path, base_cfg, name, kind):
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 2, "save_every": 2}))
    (run / name).unlink()
    if kind == "fifo":
        os.mkfifo(run / name)
    elif kind.endswith("link"):  # appending would write through it, or (dangling) fail once the folder is taken
        target = tmp_path / "elsewhere.jsonl" if kind == "link" else tmp_path / "gone" / "m.jsonl"
        if kind == "link":
            target.write_text("")
        (run / name).symlink_to(target)
    else:
        (run / name).mkdir()
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    old = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(60)
    try:
        with pytest.raises(LcftError) as e:
            train(TrainConfig(out=str(run), resume="auto", **{**base_cfg, "steps": 3}))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert str(e.value) == f"{run / name} is not a file train wrote (a link, a folder or a FIFO); remove it and re-run"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_run_failing_once_it_holds_its_folder_gives_the_folder_back(tmp_path, base_cfg, monkeypatch):
    """The metrics log failing to open after the run folder's lock is taken (a full disk, say): the next run of
    that folder in the same process is not refused as another writer (the lock had been kept for as long as the
    failed trainer lived, here in the error's traceback)."""
    import lcft.train.trainer as trainer_module

    def no_log(*_args: object) -> None:
        raise LcftError("metrics.jsonl cannot be opened")

    run = tmp_path / "run"
    monkeypatch.setattr(trainer_module, "MetricsLog", no_log)
    with pytest.raises(LcftError, match="metrics.jsonl cannot be opened") as failed:
        train(TrainConfig(out=str(run), **{**base_cfg, "steps": 1}))
    monkeypatch.undo()
    assert train(TrainConfig(out=str(run), **{**base_cfg, "steps": 1}))["step"] == 1
    assert failed.value is not None  # (held until here)


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_superseded_entry_that_is_not_a_folder_is_one_line_before_anything_moves(tmp_path, base_cfg, kind):
    """--resume of an earlier step moves the later checkpoints into <run>/superseded/: a link there (to a folder
    outside the run) or a file is refused in one line, and no checkpoint moves (a link had them renamed into its
    target)."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    train(TrainConfig(out=str(run), **{**base_cfg, "steps": 4, "save_every": 2}))
    elsewhere.mkdir()
    if kind == "link":
        (run / "superseded").symlink_to(elsewhere)
    else:
        (run / "superseded").write_text("")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(LcftError) as e:
        train(TrainConfig(out=str(run), **{**base_cfg, "steps": 4, "save_every": 2,
                                           "resume": str(latest_checkpoint(run).with_name("step-00000002"))}))
    assert str(e.value) == f"{run / 'superseded'} is not a folder train made (a link or a file); remove it and re-run"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert list(elsewhere.iterdir()) == []


def test_the_changed_data_line_shows_saved_values_escaped():
    """A state's data identity reaches the screen: whatever it holds (read_state refuses what no run writes), the
    line is one line of printable text naming each difference."""
    forged = "\x1b[2J\x1b[H\x1b[32mall checks passed\nerror: fake second line"
    state = TrainerState(data={"length": forged, "stride": 8,
                               "sha256": {"\x1b]0;owned\x07train.bin": "\x1b[31m" + "a" * 60}})
    manifest = {"length": 16, "stride": 8, "splits": {"train": {"files": {"train.bin": {"sha256": "b" * 64}}}}}
    [line] = record_data(state, manifest)
    assert line.isprintable(), line
    assert line == ("data contents: length '\\x1b[2J\\x1b[H\\x1b[32mall checks passed\\nerror: fake second line' -> 16, "
                    "'\\x1b]0;owned\\x07train.bin' sha256 '\\x1b[31maaaaaaa' -> none, train.bin sha256 none -> bbbbbbbbbbbb")


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder): what a refused start must leave as it was."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def test_steps_not_past_the_resumed_checkpoint_are_refused_before_anything_is_written(tmp_path, base_cfg):
    """--resume of a step-2 checkpoint with --steps 1 (or --steps 2 into another folder) has no step to train: one
    line naming --steps and the checkpoint's step, and nothing written (it ended 'done at step 2/1', a new folder
    left with no checkpoint). The finished run started again with its own --steps still ends as done."""
    run = tmp_path / "run"
    cfg = {**base_cfg, "steps": 2, "save_every": 2}
    first = train(TrainConfig(out=str(run), **cfg))
    ckpt = run / "checkpoints" / "step-00000002"
    before = _tree(run)
    for out, resume, steps in ((tmp_path / "new", str(run), 1), (tmp_path / "new", str(run), 2), (run, "auto", 1)):
        with pytest.raises(LcftError) as e:
            train(TrainConfig(out=str(out), resume=resume, **{**cfg, "steps": steps}))
        assert str(e.value) == f"--steps {steps} is not past the checkpoint's step 2 ({ckpt}); raise --steps"
        assert not (tmp_path / "new").exists() and _tree(run) == before

    again = train(TrainConfig(out=str(run), resume="auto", **cfg))
    assert (again["step"], again["stopped"], again["checkpoint"]) == (2, "done", str(ckpt))
    assert again["loss"] == first["loss"] and [s for s, _ in list_checkpoints(run)] == [2]


def test_steps_at_an_earlier_checkpoint_of_the_run_are_refused_and_nothing_moves(tmp_path, base_cfg):
    """--resume of the run's step-2 checkpoint with --steps 2 while step 4 exists has no step to train: one line,
    and step 4 stays in place (it ended 'done' with step 4 moved to superseded/)."""
    run = tmp_path / "run"
    cfg = {**base_cfg, "steps": 4, "save_every": 2}
    train(TrainConfig(out=str(run), **cfg))
    ckpt = run / "checkpoints" / "step-00000002"
    before = _tree(run)
    with pytest.raises(LcftError) as e:
        train(TrainConfig(out=str(run), resume=str(ckpt), **{**cfg, "steps": 2}))
    assert str(e.value) == f"--steps 2 is not past the checkpoint's step 2 ({ckpt}); raise --steps"
    assert _tree(run) == before and [s for s, _ in list_checkpoints(run)] == [2, 4]


def test_a_resume_at_steps_already_names_no_changed_option(tmp_path, base_cfg, capsys):
    """--resume of the run's latest step 4 with --steps 4 (the run was given 6) and another --lr trains nothing and
    ends done: no line of options that apply from a next step (it said 'steps: 6 -> 4; lr: ...')."""
    run, cfg = tmp_path / "run", {**base_cfg, "save_every": 2}
    train(TrainConfig(out=str(run), stop_after=4, **cfg))
    capsys.readouterr()
    s = train(TrainConfig(out=str(run), resume="auto", **{**cfg, "steps": 4, "lr": 5e-4}))
    assert (s["step"], s["stopped"]) == (4, "done")
    assert _lines(capsys, "changed options") == []


def test_a_step_superseded_twice_is_named_as_its_checkpoint_folder(tmp_path, base_cfg, capsys):
    """Step 4 superseded a second time goes to superseded/step-00000004.1: the line names the checkpoint's folder
    step-00000004 (it named the new folder's name) and where it went."""
    run, cfg = tmp_path / "run", {**base_cfg, "steps": 4, "save_every": 1, "keep_last": 0}
    train(TrainConfig(out=str(run), **cfg))
    ckpt = run / "checkpoints" / "step-00000003"
    train(TrainConfig(out=str(run), resume=str(ckpt), **cfg))
    capsys.readouterr()
    train(TrainConfig(out=str(run), resume=str(ckpt), **cfg))
    assert _lines(capsys, "is after the resumed step") == [
        f"step-00000004 is after the resumed step 3: moved to {run / 'superseded' / 'step-00000004.1'}"]


def test_a_checkpoint_from_outside_a_folder_holding_another_run_is_refused_and_nothing_moves(tmp_path, base_cfg):
    """--resume of run a's checkpoint into a folder holding run b's checkpoints would keep b's steps up to it,
    supersede b's later ones and mix both runs' metrics (it did, saying b's options changed): one line, and b
    stays as it was. Into a new folder the checkpoint starts a run there, as before."""
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(out=str(a), **{**base_cfg, "steps": 2, "save_every": 2}))
    train(TrainConfig(out=str(b), **{**base_cfg, "steps": 3, "save_every": 1, "lr": 5e-4}))
    ckpt, before = a / "checkpoints" / "step-00000002", _tree(b)
    with pytest.raises(LcftError) as e:
        train(TrainConfig(out=str(b), resume=str(ckpt), **{**base_cfg, "steps": 4}))
    assert str(e.value) == (f"{b} holds another run's checkpoints (latest step-00000003); --resume {ckpt} starts a "
                            "run from outside it: choose another --out, or pass --resume auto to continue that run")
    assert _tree(b) == before
    s = train(TrainConfig(out=str(tmp_path / "new"), resume=str(ckpt), **{**base_cfg, "steps": 3}))
    assert (s["step"], s["stopped"]) == (3, "done")


def test_changed_options_are_named_against_the_checkpoint_resumed(tmp_path, base_cfg, one_process_run, capsys):
    """The options a resume changes are those its checkpoint was trained with, not the run folder's config.toml:
    a checkpoint resumed into a new folder with another --lr said nothing; after an invocation with another --lr
    that saved no checkpoint, a resume with the checkpoint's own lr named a change, and is the run that never
    stopped (the session's uninterrupted one), bit for bit."""
    run, cfg = tmp_path / "run", {**base_cfg, "save_every": 2, "keep_last": 0}
    train(TrainConfig(out=str(run), stop_after=2, **cfg))
    ckpt = run / "checkpoints" / "step-00000002"
    capsys.readouterr()
    train(TrainConfig(out=str(tmp_path / "fork"), resume=str(ckpt), stop_after=1, **{**cfg, "lr": 5e-4}))
    assert _lines(capsys, "changed options") == [
        "resuming with changed options: lr: 0.001 -> 0.0005 (they apply from the next step; the schedule continues "
        "from its position)"]
    with pytest.raises(Crash):
        train(TrainConfig(out=str(run), resume="auto", **{**cfg, "lr": 5e-4}), _crash_at(3))
    assert load_toml(run / "config.toml")["lr"] == 5e-4
    capsys.readouterr()
    train(TrainConfig(out=str(run), resume="auto", **cfg))
    assert _lines(capsys, "changed options") == []
    assert_same_run(one_process_run, run)


def test_model_overrides_left_unset_on_resume_keep_the_runs(tmp_path, base_cfg, capsys):
    """A run started sparse with its own RoPE base, resumed without those flags, keeps its model (None is the
    model's own, the checkpoint's): no 'changed options' line (it named 'attention: sparse -> the default ...,
    dense for a preset' and two more), the config.toml saved still records them, and the resumed run is the one
    that never stopped, bit for bit."""
    model = {"attention": "sparse", "block_size": 64, "top_k": 2, "rope_theta": 5e5}
    cfg = {**base_cfg, "steps": 4, "save_every": 2}
    train(TrainConfig(out=str(tmp_path / "a"), **cfg, **model))
    train(TrainConfig(out=str(tmp_path / "b"), stop_after=2, **cfg, **model))
    capsys.readouterr()
    train(TrainConfig(out=str(tmp_path / "b"), resume="auto", **cfg))
    assert _lines(capsys, "changed options") == []
    saved = load_toml(tmp_path / "b" / "config.toml")
    assert {k: saved.get(k) for k in model} == model
    assert_same_run(tmp_path / "a", tmp_path / "b")
