"""`lcft eval` run again into a folder holding its finished report: one line, no model loaded (launched: no
process started), unless an input changed (other weights at the same path, another checkpoint, other options):
then evaluated again."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

import lcft.launch as launching
from lcft.cli.app import app
from lcft.evaluate import runner as eval_runner
from tests.evaluate.conftest import data_dir, save_model  # noqa: F401 (fixture)

cli = CliRunner()


def test_a_finished_report_of_the_same_inputs_is_not_computed_again(data_dir, tmp_path, monkeypatch):  # noqa: F811
    a, b = save_model(tmp_path / "a", seed=1), save_model(tmp_path / "b", seed=2)
    out = tmp_path / "rep"
    loads: list[str] = []
    real = eval_runner.load_model
    monkeypatch.setattr(eval_runner, "load_model", lambda info, device: loads.append(info.label) or real(info, device))

    def run(*ckpts, bins="4", quiet=()) -> str:
        loads.clear()
        args = ["eval", "--data", str(data_dir), *(f"--checkpoint={c}" for c in ckpts), "--max-windows", "2",
                "--bins", bins, "--bootstrap", "50", "--out", str(out), *quiet]
        r = cli.invoke(app, args)
        assert r.exit_code == 0, r.output
        return r.stdout

    first = run(a, b)
    assert loads == ["a", "b"] and "uniform guess" in first
    before = (out / "eval.json").read_bytes()
    again = run(a, b)
    assert loads == [] and again.splitlines() == [
        f"already evaluated: {out}; the same checkpoints (by content), data and options: nothing computed "
        f"(the report: {out / 'eval.json'})"]
    assert (out / "eval.json").read_bytes() == before  # left as it was
    shutil.rmtree(a)
    shutil.copytree(b, a)  # other weights under the same path: its digest differs
    run(a, b)
    assert loads == ["a", "b"]
    c = save_model(tmp_path / "c", seed=3)
    run(a, c)  # another checkpoint into the same folder: evaluated, its report replacing the first
    assert loads == ["a", "c"]
    assert [ck["label"] for ck in json.loads((out / "eval.json").read_text())["checkpoints"]] == ["a", "c"]
    run(a, c, bins="5")  # other options: evaluated again
    assert loads == ["a", "c"]
    run(a, c, bins="5")
    assert loads == []
    assert run(a, c, bins="5", quiet=("--quiet",)) == "" and loads == []  # --quiet: nothing on stdout, this line too


@pytest.mark.distributed
def test_a_launched_rerun_of_a_finished_report_starts_no_process(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """`--nproc 2` over a report of other options: it launches and replaces the report; run again, its launcher
    finds the report of the same inputs (rank 0's device kind, the weights by content) and says so, no process
    started, the report files untouched. (The report of other options is a one-process one: one launch, not two;
    a one-process report is returned to a launch of the same options in the tests below.)"""
    model, out = save_model(tmp_path / "m", seed=1), tmp_path / "rep"
    launches: list[int] = []
    real = launching.launch
    monkeypatch.setattr(launching, "launch", lambda *a: launches.append(a[1].nproc) or real(*a))

    def run(bins: str, *launch: str) -> str:
        launches.clear()
        r = cli.invoke(app, ["eval", "--data", str(data_dir), "-c", str(model), "--max-windows", "2", "--bins", bins,
                             "--bootstrap", "50", "--out", str(out), *launch])
        assert r.exit_code == 0, r.output
        return r.stdout

    def files() -> dict[str, tuple[bytes, int]]:
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.iterdir())}

    assert "uniform guess" in run("5") and launches == []
    first = files()
    assert "uniform guess" in run("4", "--nproc", "2") and launches == [2]  # another option: evaluated again
    before = files()
    assert sorted(before) == sorted(first) == ["eval.json", "eval.toml", "loss_by_position.csv", "loss_by_position.png"]
    assert before["eval.json"][0] != first["eval.json"][0] and json.loads(before["eval.json"][0])["options"]["bins"] == 4
    assert run("4", "--nproc", "2").splitlines() == [
        f"already evaluated: {out}; the same checkpoints (by content), data and options: nothing computed "
        f"(the report: {out / 'eval.json'})"]
    assert launches == [] and files() == before  # byte for byte, not written again


def _eval(data_dir, model, out, *more: str) -> str:  # noqa: F811
    r = cli.invoke(app, ["eval", "--data", str(data_dir), "-c", str(model), "--max-windows", "2", "--bins", "4",
                         "--bootstrap", "50", "--out", str(out), *more])
    assert r.exit_code == 0, r.output
    return r.stdout


def _no_launch(monkeypatch) -> list[int]:
    """The processes each launch would start; none is started (a reused report needs none)."""
    launches: list[int] = []

    def launch(name, cfg, entry):
        launches.append(cfg.nproc)
        raise AssertionError("launched")

    monkeypatch.setattr(launching, "launch", launch)
    return launches


def _loads(monkeypatch) -> list[str]:
    """The labels of the checkpoints each evaluation loads (none for a report reused)."""
    loads: list[str] = []
    real = eval_runner.load_model
    monkeypatch.setattr(eval_runner, "load_model", lambda info, device: loads.append(info.label) or real(info, device))
    return loads


@pytest.mark.parametrize("more", [("--nproc", "2"), ("--collective-timeout", "30", "--stop-grace", "5"),
                                  ("--nproc", "2", "--max-restarts", "1")])
def test_a_one_process_report_is_reused_under_other_launch_options(data_dir, tmp_path, monkeypatch,  # noqa: F811
                                                                   more):
    """The launch options change no figure: a finished one-process report is returned as it is, no model loaded
    and no process started."""
    model, out = save_model(tmp_path / "m", seed=1), tmp_path / "rep"
    loads, launches = _loads(monkeypatch), _no_launch(monkeypatch)
    assert "uniform guess" in _eval(data_dir, model, out) and loads == ["m"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    loads.clear()
    assert _eval(data_dir, model, out, *more).startswith(f"already evaluated: {out};")
    assert loads == [] and launches == [] and {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_report_copied_to_another_folder_is_reused_there(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """The folder's path changes no figure: its copy is returned as it is (the record of the run that computed
    it, its `out` that run's); an option that changes a figure (--seed: the bootstrap's draws) evaluates again."""
    model, out = save_model(tmp_path / "m", seed=1), tmp_path / "rep"
    loads = _loads(monkeypatch)
    _eval(data_dir, model, out)
    copy = tmp_path / "moved" / "rep"
    shutil.copytree(out, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    loads.clear()
    assert _eval(data_dir, model, copy).startswith(f"already evaluated: {copy};") and loads == []
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    assert json.loads((copy / "eval.json").read_text())["options"]["out"] == str(out)
    assert "uniform guess" in _eval(data_dir, model, copy, "--seed", "1") and loads == ["m"]
    assert json.loads((copy / "eval.json").read_text())["options"]["out"] == str(copy)


def test_a_one_process_copy_probe_is_not_taken_for_a_launched_one(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """Several ranks run the copy probe over whole windows, one process only over the pieces its target depends
    on (other batches, so other rounding): a one-process report with a probe is not returned to a launch, and
    still is to one process under other launch options."""
    model, out = save_model(tmp_path / "m", seed=1), tmp_path / "rep"
    launches = _no_launch(monkeypatch)
    probe = ("--probe", "copy", "--probe-distances", "512", "--max-context", "1K")
    assert "uniform guess" in _eval(data_dir, model, out, *probe)
    assert _eval(data_dir, model, out, *probe, "--collective-timeout", "30").startswith("already evaluated")
    r = cli.invoke(app, ["eval", "--data", str(data_dir), "-c", str(model), "--max-windows", "2", "--bins", "4",
                         "--bootstrap", "50", "--out", str(out), *probe, "--nproc", "2"])
    assert launches == [2] and "launched" in repr(r.exception)


@pytest.mark.parametrize("device,nproc,gpus,said", [("cuda:0", 2, 2, "each rank evaluates on its own GPU"),
                                                     ("auto", 2, 1, "this machine has 1 GPU(s)")])
def test_a_rerun_the_ranks_would_refuse_is_refused_by_its_launcher(data_dir, tmp_path, monkeypatch,  # noqa: F811
                                                                     device, nproc, gpus, said):
    """A finished report there, and a launch whose rank 1 would refuse its --device (cuda:0 for two ranks, more
    ranks than GPUs): the launcher refuses it as that rank would, rather than answer "already evaluated" (on a
    machine whose CUDA reports `gpus` GPUs; the report was computed on the CPU, so nothing is reused anyway)."""
    import torch

    model, out = save_model(tmp_path / "m", seed=1), tmp_path / "rep"
    _eval(data_dir, model, out)
    launches = _no_launch(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    r = cli.invoke(app, ["eval", "--data", str(data_dir), "-c", str(model), "--max-windows", "2", "--bins", "4",
                         "--bootstrap", "50", "--out", str(out), "--device", device, "--nproc", str(nproc)])
    assert r.exit_code == 1 and said in r.output and launches == [], r.output
