"""`lcft demo` with very small settings: every stage runs, the report is written, a re-run skips finished stages."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from tests.one_line import cli_fails

runner = CliRunner()

SMALL = ["--length", "2K", "--base-context", "256", "--steps", "3", "--long-steps", "2", "--base-batch", "2",
         "--eval-windows", "2", "--hidden-size", "32", "--intermediate-size", "64", "--bins", "4", "--no-progress",
         "--control-steps", "0"]  # the positive-control stage has its own test (tests/recipes/test_demo.py)


@pytest.mark.slow
def test_demo_runs_every_stage_then_skips_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative --out: a skipped stage names its checkpoint as a trained one does
    out = Path("demo")
    r = runner.invoke(app, ["demo", "--out", str(out), *SMALL])
    assert r.exit_code == 0, r.output
    for text in ("base@256", "long@2K", "long@256 (control)", "uniform guess", "cannot show: a long-context gain",
                 "loss_by_position.png"):
        assert text in r.output, text
    rep = json.loads((out / "report" / "eval.json").read_text())
    base, long, ctrl = rep["checkpoints"]
    assert [c["max_context"] for c in rep["checkpoints"]] == [256, 0, 256]
    assert long["weights_sha256"] == ctrl["weights_sha256"] != base["weights_sha256"]
    assert long["lcft"]["attention"]["backend"] == "sparse" and base["lcft"]["attention"]["backend"] == "dense"
    assert long["train_config"]["seq_len"] == 2048 and base["train_config"]["seq_len"] == 256
    assert rep["data"]["windows"] == 2 and (out / "report" / "loss_by_position.png").stat().st_size > 10_000
    demo = json.loads((out / "demo.json").read_text())
    assert set(demo["stages"]) == {"prepare", "init", "base", "long", "control", "eval"}

    again = runner.invoke(app, ["demo", "--out", str(out), *SMALL])
    assert again.exit_code == 0, again.output
    assert again.output.count("skipped") == 3 and "not kept" not in again.output  # base, long, eval
    assert json.loads((out / "report" / "eval.json").read_text())["checkpoints"][1]["loss"] == long["loss"]

    other = [a if a != "3" else "4" for a in SMALL]  # --steps 4: a different base run
    r = runner.invoke(app, ["demo", "--out", str(out), *other])
    assert r.exit_code == 1 and "holds a demo run made with other options" in r.output and "steps" in r.output


def test_demo_refuses_a_base_context_that_does_not_divide_the_window(tmp_path):
    r = runner.invoke(app, ["demo", "--out", str(tmp_path / "d"), "--length", "2K", "--base-context", "768"])
    assert r.exit_code == 1 and "error: --length 2048 is not a multiple of --base-context 768" in r.output, r.output
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_sigterm_during_a_training_stage_ends_the_demo(tmp_path):
    """SIGTERM while the base model trains: that stage saves and the whole demo stops there with 143 (128 +
    SIGTERM) and one line saying how to continue; no later stage starts."""
    out = tmp_path / "demo"
    steps = [a if a != "3" else "100000" for a in SMALL]  # a base run far longer than the test
    proc = subprocess.Popen([sys.executable, "-m", "lcft", "demo", "--out", str(out), *steps],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = out / "runs" / "base" / "metrics.jsonl", time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0] and "run the same `lcft demo` again" in errors[0]
    assert "4/6" not in stdout and not (out / "runs" / "long").exists(), stdout


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[list[str], dict]:
    """A finished small demo (its options, its report)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    args = ["demo", "--out", str(out), *SMALL, "--probe-windows", "0"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return args, json.loads((out / "report" / "eval.json").read_text())


def _edited(report: dict, damage: str) -> str:
    """The text of `report` with one figure changed as `damage` says."""
    r = json.loads(json.dumps(report))
    if damage == "checkpoints-not-tables":
        r["checkpoints"] = [5, 6, 7]
    elif damage.startswith("replicates="):  # the bootstrap allocates replicates x windows int64
        r["bootstrap"]["replicates"] = int(damage.partition("=")[2])
    elif damage.startswith("no "):
        del r[damage[3:]]
    elif damage == "loss-not-a-number":
        r["checkpoints"][1]["loss"] = "low"
    elif damage == "loss-NaN":
        return json.dumps(r).replace(f'"loss": {json.dumps(r["checkpoints"][1]["loss"])}', '"loss": NaN', 1)
    return json.dumps(r)


@pytest.mark.parametrize("damage", ["[1]", "[" * 10**5 + "]" * 10**5, "checkpoints-not-tables", "replicates=1001",
                                    "replicates=10000000000", "no bootstrap", "no uniform", "loss-not-a-number",
                                    "loss-NaN"])
def test_a_damaged_report_is_made_again_on_a_rerun(finished, tmp_path, damage):
    args, report = finished
    path = Path(args[2]) / "report" / "eval.json"
    path.write_text(damage if damage.startswith("[") else _edited(report, damage))
    r = runner.invoke(app, args)
    assert r.exit_code == 0, (r.output, r.exception)
    assert r.output.count("the report there is not kept (") == 1 and "evaluated again" in r.output, r.output
    again = json.loads(path.read_text())
    assert [c["loss"] for c in again["checkpoints"]] == [c["loss"] for c in report["checkpoints"]]
    assert again["bootstrap"] == report["bootstrap"] and "uniform" in again


@pytest.mark.parametrize("place", ["a file", "under a file", "a folder of other files"])
def test_an_out_that_is_not_a_demo_folder_is_one_line_and_untouched(tmp_path, place):
    target = {"a file": tmp_path / "f", "under a file": tmp_path / "f" / "sub", "a folder of other files": tmp_path / "d"}
    (tmp_path / "f").write_text("mine")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "report").mkdir()
    (tmp_path / "d" / "report" / "eval.json").write_text("mine")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    cli_fails(["demo", "--out", str(target[place]), *SMALL], f"--out {target[place]}")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "f").read_text() == (tmp_path / "d" / "report" / "eval.json").read_text() == "mine"
