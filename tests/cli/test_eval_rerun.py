"""`lcft eval` run again into a folder holding its finished report: one line, no model loaded, unless an input
changed (other weights at the same path, another checkpoint, other options): then evaluated again."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

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
