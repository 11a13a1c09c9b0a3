"""`lcft eval` on the command line: a thin wrapper (flags, --config TOML, exit codes, one-line errors)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lcft.cli.app import app
from tests.evaluate.conftest import WINDOW, data_dir, save_model  # noqa: F401 (fixture)

runner = CliRunner()


def test_eval_cli_writes_the_report_and_prints_the_table(data_dir, tmp_path):  # noqa: F811
    a = save_model(tmp_path / "a", seed=1)
    out = tmp_path / "rep"
    r = runner.invoke(app, ["eval", "--data", str(data_dir), "--checkpoint", str(a), "--checkpoint", str(a),
                            "--label", "full", "--label", "cut", "--max-context", "0", "--max-context", "1K",
                            "--bins", "4", "--bin-scale", "log", "--max-windows", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "uniform guess" in r.output and "loss_by_position.png" in r.output
    rep = json.loads((out / "eval.json").read_text())
    assert [c["label"] for c in rep["checkpoints"]] == ["full", "cut"]
    assert [c["max_context"] for c in rep["checkpoints"]] == [0, 1024]
    assert rep["options"]["bin_scale"] == "log" and rep["data"]["windows"] == 2
    # The resolved config reproduces the run (flags override it).
    out2 = tmp_path / "rep2"
    r = runner.invoke(app, ["eval", "--config", str(out / "eval.toml"), "--out", str(out2), "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads((out2 / "eval.json").read_text())["checkpoints"][1]["loss"] == rep["checkpoints"][1]["loss"]


def test_eval_cli_bad_input_is_one_line_and_exit_1(data_dir, tmp_path):  # noqa: F811
    a = save_model(tmp_path / "a", seed=1)
    cases = [
        (["--checkpoint", str(a), "--max-context", str(2 * WINDOW)], "larger than the window"),
        (["--checkpoint", str(tmp_path / "missing")], "checkpoint not found"),
        (["--checkpoint", str(a), "--bin-scale", "cubic"], "bin_scale"),
        ([], "no checkpoint given"),
    ]
    for extra, msg in cases:
        r = runner.invoke(app, ["eval", "--data", str(data_dir), "--out", str(tmp_path / "o"), *extra])
        assert r.exit_code == 1, (extra, r.output)
        assert msg in r.output and "Traceback" not in r.output
    toml = tmp_path / "bad.toml"
    toml.write_text('checkpoint = ["x"]\n')
    r = runner.invoke(app, ["eval", "--config", str(toml)])
    assert r.exit_code == 1 and "unknown eval config key 'checkpoint'" in r.output
    assert not (tmp_path / "o").exists()
