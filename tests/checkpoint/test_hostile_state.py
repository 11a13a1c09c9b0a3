"""Crafted values in a checkpoint's files, through the paths that read them: a DCP `.metadata` whose tensors claim a
dtype that is not a floating-point torch dtype (a string, int64), and an rng.pt of plain tensors and strings whose
values are not the RNG states lcft writes. Each is one line naming the file (exit 1 and `error: ...` on the
command line), never a traceback, a half-restored RNG or an exported all-zero int64 model."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from typer.testing import CliRunner

from lcft.checkpoint.dcp_metadata import read_metadata_file
from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.save import write_checksums
from lcft.checkpoint.state import read_trainer_state, set_rng_state
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.train import TrainConfig, train
from tests.one_line import cli_fails
from tests.probes import peak_growth

STATE = "trainer_state"


@pytest.fixture
def sharded(tmp_path, init_dir) -> Path:
    """The small model as a sharded checkpoint folder: config.json, lcft.json saying "dcp", and dcp/."""
    out = tmp_path / "sharded"
    out.mkdir()
    shutil.copy(init_dir / "config.json", out / "config.json")
    meta = json.loads((init_dir / "lcft.json").read_text())
    (out / "lcft.json").write_text(json.dumps({**meta, "weights": "dcp"}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": dict(from_pretrained(init_dir).state_dict())}, checkpoint_id=str(out / "dcp"),
                 no_dist=True)
    return out


def test_sharded_fixture_exports(sharded, tmp_path, init_dir):
    res = CliRunner().invoke(app, ["export", str(sharded), "--out", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    want = load_file(init_dir / "model.safetensors")
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("dtype", ["float32", torch.int64, torch.complex64], ids=["str", "int64", "complex64"])
def test_dcp_tensor_dtype_not_floating_is_refused(sharded, tmp_path, dtype):
    path = sharded / "dcp" / ".metadata"
    md = dcp.FileSystemReader(str(sharded / "dcp")).read_metadata()
    for v in md.state_dict_metadata.values():
        v.properties = dataclasses.replace(v.properties, dtype=dtype)
    path.write_bytes(pickle.dumps(md))
    with pytest.raises(LcftError) as e:
        read_metadata_file(path)
    assert str(path) in str(e.value) and "dtype" in str(e.value) and "\n" not in str(e.value)
    cli_fails(["export", str(sharded), "--out", str(tmp_path / "hf")], str(path), "dtype")
    assert not (tmp_path / "hf").exists()


def _drop(obj: Any, name: str) -> Any:
    del obj.__dict__[name]  # pickled without it: BUILD gives the unpickled object only what the file holds
    return obj


@pytest.mark.parametrize("damage", [
    lambda md: _drop(md, "state_dict_metadata"),
    lambda md: setattr(md, "storage_data", ["0.distcp"]),
    lambda md: [_drop(v, "properties") for v in md.state_dict_metadata.values()],
    lambda md: [_drop(v, "relative_path") for v in md.storage_data.values()],
], ids=["no entries", "storage a list", "no properties", "no shard path"])
def test_dcp_metadata_missing_a_field_is_refused(sharded, tmp_path, damage):
    """A Metadata pickled without a field it always has (or with storage data of another kind) is one line
    naming the file, from the reader and from export, which writes nothing."""
    path = sharded / "dcp" / ".metadata"
    md = dcp.FileSystemReader(str(sharded / "dcp")).read_metadata()
    damage(md)
    path.write_bytes(pickle.dumps(md))
    with pytest.raises(LcftError) as e:
        read_metadata_file(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    cli_fails(["export", str(sharded), "--out", str(tmp_path / "hf")], str(path))
    assert not (tmp_path / "hf").exists()


SAVED_RUN = dict(steps=2, warmup=1, save_every=1)  # checkpoints at steps 1 and 2 (conftest.saved_run)


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


def _set(r: dict, key: str, index: int, value: Any) -> None:
    r[key][index] = value


def _word(r: dict, key: str, at: int, value: int) -> None:
    r[key][1] = r[key][1].clone()
    r[key][1][at] = value


# each: plain tensors, numbers and strings (torch.load(weights_only=True) reads them), not what rng_state writes
CRAFTED = {
    "numpy-name": lambda r: _set(r, "numpy", 0, "evil"),
    "numpy-position": lambda r: _set(r, "numpy", 2, 10**6),  # numpy takes it and reads past its 624 words
    "numpy-word": lambda r: _word(r, "numpy", 0, 1 << 40),  # would wrap to another state in uint32
    "numpy-has-gauss": lambda r: _set(r, "numpy", 3, 7),
    "python-version": lambda r: _set(r, "python", 0, 99),
    "python-gauss": lambda r: _set(r, "python", 2, "x"),  # random takes it; random.gauss() fails later
    "python-position": lambda r: _word(r, "python", 624, 700),
    "python-word": lambda r: _word(r, "python", 0, -1),
    "torch-size": lambda r: r.__setitem__("torch", torch.zeros(3, dtype=torch.uint8)),
    "torch-content": lambda r: r.__setitem__("torch", torch.zeros_like(r["torch"])),
    "cuda-not-tensors": lambda r: r.__setitem__("cuda", ["x"]),
}


@pytest.mark.parametrize("mode", list(CRAFTED))
def test_crafted_rng_state_is_one_line_naming_it(run_copy, mode):
    run, cfg = run_copy
    path = ckpt(run, 2) / STATE / "rng.pt"
    r = torch.load(path, weights_only=True)
    CRAFTED[mode](r)
    torch.save(r, path)
    write_checksums(ckpt(run, 2))  # the checksums agree: the reader itself must refuse
    before = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 2)), "steps": 3}))
    msg = str(e.value)
    assert str(path) in msg and "corrupt trainer state" in msg and "\n" not in msg
    assert f"--resume {ckpt(run, 1)}" in msg
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()
    assert torch.equal(torch.get_rng_state(), before[2])  # nothing restored half-way


def _first_state(o: dict) -> dict:
    return next(iter(o["state"].values()))


# each: plain data torch.load(weights_only=True) reads, not what this run's schedule or optimizer writes; loaded,
# each failed in torch's load_state_dict or the first step with a traceback, set the schedule elsewhere, or (the
# values) made every update non-finite
CRAFTED_TRAINING = {
    "scheduler.pt": {
        "position-text": lambda s: s.__setitem__("last_epoch", "x"),
        "position-elsewhere": lambda s: s.__setitem__("last_epoch", 10**30),  # trained on at an lr of the far end
        "lambdas": lambda s: s.__setitem__("lr_lambdas", [{"x": 1}, {"y": 2}, {"z": 3}]),
        "an-attribute": lambda s: s.__setitem__("optimizer", 5),  # set over the schedule's own optimizer
        "empty": lambda s: s.clear(),
        "base-lrs": lambda s: s.__setitem__("base_lrs", [float("nan"), 1.0]),
    },
    "optimizer.pt": {
        "no-groups": lambda o: o.__setitem__("param_groups", []),
        "ids": lambda o: o["param_groups"][0].__setitem__("params", [999]),
        "shape": lambda o: _first_state(o).__setitem__("exp_avg", torch.zeros(3)),
        "step-shape": lambda o: _first_state(o).__setitem__("step", torch.zeros(2)),
        "not-a-table": lambda o: o.__setitem__("state", "x"),
        "not-a-parameter": lambda o: o["state"].__setitem__(10**6, {}),
        "integer-moments": lambda o: _first_state(o).__setitem__("exp_avg_sq",
                                                                 _first_state(o)["exp_avg_sq"].long()),
        # right kinds and shapes, values no update writes: loaded, every later update is non-finite and skipped
        "nan-moment": lambda o: _first_state(o)["exp_avg"].view(-1).__setitem__(0, float("nan")),
        "inf-step": lambda o: _first_state(o).__setitem__("step", torch.tensor(float("inf"))),
        "negative-second-moment": lambda o: _first_state(o)["exp_avg_sq"].view(-1).__setitem__(-1, -1.0),
        # found by fuzzing: a KeyError in Adam's __setstate__, and a tensor where torch's load_state_dict tests a
        # truth value (an id, an option): RuntimeError
        "no-step": lambda o: _first_state(o).pop("step"),
        "id-tensor": lambda o: o["param_groups"][0]["params"].__setitem__(0, torch.tensor([])),
        "option-tensor": lambda o: o["param_groups"][0].__setitem__("capturable", torch.tensor([])),
    },
}


@pytest.mark.parametrize("name, mode", [(n, m) for n, modes in CRAFTED_TRAINING.items() for m in modes])
def test_crafted_schedule_or_optimizer_state_is_one_line_naming_it(run_copy, name, mode):
    """Checked against what this run built, before anything is restored (the RNGs are still this process's)."""
    run, cfg = run_copy
    path = ckpt(run, 2) / STATE / name
    saved = torch.load(path, weights_only=True)
    CRAFTED_TRAINING[name][mode](saved)
    torch.save(saved, path)
    write_checksums(ckpt(run, 2))  # the checksums agree: the check itself must refuse
    before = torch.get_rng_state()
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 2)), "steps": 3}))
    msg = str(e.value)
    assert str(path) in msg and "corrupt trainer state" in msg and "\n" not in msg, msg
    assert f"--resume {ckpt(run, 1)}" in msg
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("at", [0, -1])
def test_a_bad_moment_is_named_by_its_parameter(run_copy, init_dir, at):
    """The message names the parameter as the model does, not torch's number for it. Oracle: the model's own
    parameters in the optimizer's order (matrices, then vectors), its number `at` in that list."""
    run, cfg = run_copy
    path = ckpt(run, 2) / STATE / "optimizer.pt"
    saved = torch.load(path, weights_only=True)
    i = sorted(saved["state"])[at]
    saved["state"][i]["exp_avg"].view(-1)[0] = float("nan")
    torch.save(saved, path)
    write_checksums(ckpt(run, 2))
    params = list(from_pretrained(init_dir).named_parameters())
    name = [n for n, p in params if p.ndim >= 2] + [n for n, p in params if p.ndim < 2]
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 2)), "steps": 3}))
    assert f"exp_avg of {name[i]} holds a non-finite value" in str(e.value), str(e.value)


def test_a_schedule_saved_by_another_torch_resumes(run_copy):
    """A field of the schedule that this torch does not keep (another version's bookkeeping number) is not a
    fault; a missing optional one neither."""
    run, cfg = run_copy
    path = ckpt(run, 2) / STATE / "scheduler.pt"
    saved = torch.load(path, weights_only=True)
    saved["_a_newer_torchs_flag"] = True
    saved.pop("_get_lr_called_within_step")
    torch.save(saved, path)
    write_checksums(ckpt(run, 2))
    train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 2)), "steps": 3}))
    assert (run / "checkpoints" / "step-00000003").is_dir()


def test_crafted_rng_state_on_the_command_line(run_copy, data_dir, init_dir):
    run, _ = run_copy
    path = ckpt(run, 2) / STATE / "rng.pt"
    r = torch.load(path, weights_only=True)
    CRAFTED["numpy-name"](r)
    torch.save(r, path)
    write_checksums(ckpt(run, 2))
    cli_fails(["train", "--data", str(data_dir), "--init", str(init_dir), "--steps", "3", "--global-batch", "2",
               "--micro-batch", "1", "--seq-len", "512", "--precision", "fp32", "--out", str(run), "--resume",
               "auto"], str(path), "corrupt trainer state")


def test_untouched_rng_state_restores_exactly(saved_run):
    """The oracle: what lcft wrote reads back and restores the generators to the saved states."""
    run, _ = saved_run
    rng = read_trainer_state(ckpt(run, 2))[3]
    set_rng_state(rng)
    version, mt, gauss = random.getstate()
    assert [version, mt, gauss] == [rng["python"][0], tuple(rng["python"][1].tolist()), rng["python"][2]]
    assert (np.random.get_state()[1] == rng["numpy"][1].numpy()).all()
    assert torch.equal(torch.get_rng_state(), rng["torch"])


# each: a state.json of plain numbers that no run writes; resumed, it would move the checkpoint itself and every
# later one to superseded/ (a negative or smaller step), fail in numpy (negative samples), read other data than
# the run (samples past any batch), or disarm the spike guard (a NaN in its history, or negative losses, which no
# objective has: a deviation of 1e30 let any loss pass) or stop it with an OverflowError (a loss of 1e200, whose
# distance from the mean squared overflows)
ABSURD = {
    "step-negative": {"step": -3, "updates": -3},
    "step-not-the-folder's": {"step": 1, "updates": 1},
    "samples-negative": {"samples_seen": -4},
    "samples-huge": {"samples_seen": 10**30},
    "counts-do-not-add-up": {"updates": 1},
    "skips-in-a-row": {"consecutive_skips": 10**9},
    "elapsed-nan": {"elapsed": float("nan")},
    "elapsed-negative": {"elapsed": -5.0},
    "guard-nan": {"guard_history": [float("nan")] * 20},
    "guard-negative": {"guard_history": [-1e30, 1e30] * 10},
    "guard-overflow": {"guard_history": [1e200, 1.0] * 10},
}


@pytest.mark.parametrize("mode", list(ABSURD))
def test_absurd_trainer_state_numbers_are_one_line_and_nothing_moves(run_copy, mode):
    run, cfg = run_copy
    path = ckpt(run, 2) / STATE / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **ABSURD[mode]}))
    write_checksums(ckpt(run, 2))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": str(ckpt(run, 2))}))
    assert str(path) in str(e.value) and "corrupt trainer state" in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # no checkpoint superseded, nothing written


@pytest.mark.parametrize("name, record", [("rng.pt", "data/0"), ("optimizer.pt", "data/0"),
                                          ("scheduler.pt", "data.pkl")])
def test_a_deflated_record_is_refused_before_it_is_inflated(run_copy, name, record):
    """A record of torch.save's zip deflated (torch.save stores each as it is): zeros past the pickle's end or in
    place of a storage, 512 MiB in a file of ~0.5 MiB; torch.load inflated it whole before anything was checked."""
    run, _ = run_copy
    path = ckpt(run, 2) / STATE / name
    with zipfile.ZipFile(path) as z:
        items = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for filename, blob in items:
            if not filename.endswith("/" + record):
                z.writestr(filename, blob)
                continue
            info = zipfile.ZipInfo(filename)
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w", force_zip64=True) as w:
                w.write(blob)
                for _ in range(512):
                    w.write(bytes(1 << 20))
    write_checksums(ckpt(run, 2))
    lines, grown = peak_growth("lcft.checkpoint.state.read_trainer_state", ckpt(run, 2))
    assert grown < 128, (grown, lines)  # MiB above the peak before reading
    assert len(lines) == 1 and lines[0].startswith("LcftError") and str(path) in lines[0], lines
    assert "is compressed" in lines[0] and f"--resume {ckpt(run, 1)}" in lines[0], lines


# each: a data identity no run writes (lcft.train.run_dir.data_identity); a resume prints its values, so terminal
# escapes there would reach the screen, and a forged line would read as lcft's own
DATA = {
    "length-escapes": (lambda d: d.update(length="\x1b[2J\x1b[H\x1b[32mall checks passed\nerror: fake second line"),
                       "data.length is not a positive whole number"),
    "stride-zero": (lambda d: d.update(stride=0), "data.stride is not a positive whole number"),
    "length-a-bool": (lambda d: d.update(length=True), "data.length is not a positive whole number"),
    "stride-missing": (lambda d: d.pop("stride"), "data is not the identity lcft records"),
    "name-escapes": (lambda d: d["sha256"].update({"\x1b]0;owned\x07train.bin": "0" * 64}),
                     "data.sha256 names '\\x1b]0;owned\\x07train.bin', which is not a plain file name"),
    "name-a-path": (lambda d: d["sha256"].update({"../train.bin": "0" * 64}), "names '../train.bin'"),
    "digest-not-hex": (lambda d: d["sha256"].update({"train.bin": "\x1b[2J" + "0" * 60}),
                       "data.sha256 of train.bin is not 64 hex digits"),
    "digests-a-list": (lambda d: d.update(sha256=["train.bin"]), "data.sha256 is not an object of file names"),
}


@pytest.mark.parametrize("mode", list(DATA))
def test_a_crafted_data_identity_is_one_line_naming_the_field(run_copy, mode):
    run, cfg = run_copy
    path = ckpt(run, 2) / STATE / "state.json"
    state = json.loads(path.read_text())
    assert set(state["data"]) == {"length", "stride", "sha256"} and "train.bin" in state["data"]["sha256"]
    edit, said = DATA[mode]
    edit(state["data"])
    path.write_text(json.dumps(state))
    write_checksums(ckpt(run, 2))
    with pytest.raises(LcftError) as e:
        train(TrainConfig(**{**cfg, "resume": "auto"}))
    message = str(e.value)
    assert str(path) in message and said in message and message.isprintable(), message
