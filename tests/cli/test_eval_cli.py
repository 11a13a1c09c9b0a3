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
                            "--label", "full[/]", "--label", r"cut[bold]$\bad{$", "--max-context", "0", "--max-context", "1K",
                            "--bins", "4", "--bin-scale", "log", "--max-windows", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "uniform guess" in r.output and "loss_by_position.png" in r.output
    # labels print and plot as written: never rich markup, never matplotlib mathtext (an unknown symbol failed)
    assert "full[/]" in r.output and r"cut[bold]$\bad{$" in r.output
    assert "no effect" not in r.output
    rep = json.loads((out / "eval.json").read_text())
    assert [c["label"] for c in rep["checkpoints"]] == ["full[/]", r"cut[bold]$\bad{$"]
    assert [c["max_context"] for c in rep["checkpoints"]] == [0, 1024]
    assert rep["options"]["bin_scale"] == "log" and rep["data"]["windows"] == 2
    # The resolved config reproduces the run (flags override it; the window split's options say they do nothing
    # without --cp, on stderr, even with --quiet).
    out2 = tmp_path / "rep2"
    r = runner.invoke(app, ["eval", "--config", str(out / "eval.toml"), "--out", str(out2), "--quiet",
                            "--cp-kv", "stream"])
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and r.stderr.splitlines() == [
        "warning: --cp-kv stream has no effect with cp 1: no window is split across ranks (--cp N splits each over N)"]
    assert json.loads((out2 / "eval.json").read_text())["checkpoints"][1]["loss"] == rep["checkpoints"][1]["loss"]


def test_eval_cli_bad_input_is_one_line_and_exit_1(data_dir, tmp_path):  # noqa: F811
    a = save_model(tmp_path / "a", seed=1)
    cases = [
        (["--checkpoint", str(a), "--max-context", str(2 * WINDOW)], "larger than the window"),
        (["--checkpoint", str(a), "--max-context", "9" * 400 + "K"], "--max-context: <int of 1339 bits> is past the 64-bit"),
        (["--checkpoint", str(a), "--max-context", "9" * 400 + ".5"], "--max-context: not an integer"),
        (["--checkpoint", str(tmp_path / "missing")], "checkpoint not found"),
        (["--checkpoint", str(a), "--bin-scale", "cubic"], "--bin-scale: 'cubic' is not one of"),
        (["--checkpoint", str(a), "--label", ""], "--label 1 of 1 is empty"),
        (["--checkpoint", str(a), "--checkpoint", str(a), "--label", "a", "--label", "  "], "--label 2 of 2 is empty"),
        (["--checkpoint", str(a), "--label", "a\udcc3"], "--label 1 of 1 holds a character that is not printable"),
        ([], "no checkpoint given"),
    ]
    for extra, msg in cases:
        r = runner.invoke(app, ["eval", "--data", str(data_dir), "--out", str(tmp_path / "o"), *extra])
        assert r.exit_code == 1, (extra, r.output)
        assert isinstance(r.exception, SystemExit) and len(r.output.strip().splitlines()) == 1, (extra, r.output)
        assert msg in r.output and "Traceback" not in r.output
    toml = tmp_path / "bad.toml"
    toml.write_text('checkpoint = ["x"]\n')
    r = runner.invoke(app, ["eval", "--config", str(toml)])
    assert r.exit_code == 1 and "unknown eval config key 'checkpoint'" in r.output
    assert not (tmp_path / "o").exists()


def test_eval_cli_bad_device_is_refused_before_any_process_starts(tmp_path, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("the processes were started")

    monkeypatch.setattr("lcft.launch.run", no_launch)
    r = runner.invoke(app, ["eval", "--data", str(tmp_path / "data"), "--checkpoint", str(tmp_path / "a"),
                            "--out", str(tmp_path / "o"), "--nproc", "2", "--device", "bogus"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert r.output.strip().splitlines() == ["error: --device bogus: lcft evaluates on cpu or cuda (auto, cpu, cuda, "
                                             "cuda:N with N below 128)"]
    assert not (tmp_path / "o").exists()


def test_eval_cli_refuses_a_checkpoint_with_non_finite_loss(tmp_path):
    """A model whose embedding of N is NaN: its loss is NaN in exactly the windows holding an N before a base."""
    import numpy as np
    import torch

    from lcft.checkpoint.hf_folder import save_pretrained
    from lcft.genomics import open_windows, prepare_windows
    from lcft.genomics.tokenizer import N
    from lcft.model import Llama
    from tests.evaluate.conftest import small_config

    length, rng = 512, np.random.default_rng(0)
    ev = list(rng.choice(list("ACGT"), size=8 * length))
    for w, at in ((2, 300), (5, 100), (6, 200)):
        ev[w * length + at] = "N"  # windows 2, 5 and 6 hold an N with bases after it
    train = "".join(rng.choice(list("ACGT"), size=4 * length))
    fasta = tmp_path / "g.fa"
    fasta.write_text(f">tr\n{train}\n>ev\n{''.join(ev)}\n")
    data = tmp_path / "data"
    prepare_windows(fasta=str(fasta), out=str(data), length=length, train=("tr",), eval=("ev",))
    ws = open_windows(data, "eval")
    assert len(ws) == 8 and [i for i in range(8) if (np.asarray(ws[i]) == N).any()] == [2, 5, 6]
    good = save_model(tmp_path / "good", seed=1)
    torch.manual_seed(1)
    model = Llama(small_config())
    with torch.no_grad():
        model.embed_tokens.weight[N] = float("nan")
    bad = save_pretrained(model, tmp_path / "bad")
    out = tmp_path / "rep"
    r = runner.invoke(app, ["eval", "--data", str(data), "--checkpoint", str(good), "--checkpoint", str(bad),
                            "--label", "ref", "--label", "diverged", "--max-windows", "6", "--bins", "4",
                            "--out", str(out), "--quiet"])
    assert r.exit_code == 1, r.output
    msg = "diverged: non-finite loss in 2 window(s) (first: window 2)"  # window 6 is past --max-windows
    assert msg in r.output and "Traceback" not in r.output
    assert len([line for line in r.output.splitlines() if line.strip()]) == 1
    # No report; the losses of the windows run are kept for a rerun (without the diverged checkpoint, the
    # reference's windows are read back: tests/evaluate/test_resume.py)
    assert [p.name for p in out.iterdir()] == [".partial"]


def test_eval_progress_goes_to_stderr_and_stdout_holds_the_report(data_dir, tmp_path):  # noqa: F811
    """`lcft eval ... > table.txt`: the progress bar (drawn once at its end when stderr is not a terminal) goes to
    stderr, as prepare's does; stdout starts with the table."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    a = save_model(tmp_path / "a", seed=1)
    r = subprocess.run([sys.executable, "-m", "lcft", "eval", "--data", str(data_dir), "-c", str(a), "--bins", "4",
                        "--max-windows", "2", "--out", str(tmp_path / "rep")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("held-out loss") and "2/2 windows" in r.stderr, (r.stdout[:500], r.stderr[-500:])


def test_the_saved_config_reruns_from_another_working_folder(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """eval.toml holds --data, --checkpoint and --out as absolute paths, so `--config` from elsewhere evaluates
    the same checkpoint on the same data (they had been relative to the first run's working folder)."""
    import os

    a = save_model(tmp_path / "a", seed=1)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["eval", "--data", os.path.relpath(data_dir), "--checkpoint", "a", "--max-windows", "1",
                            "--out", "rep", "--quiet"])
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = runner.invoke(app, ["eval", "--config", str(tmp_path / "rep" / "eval.toml"), "--out", "rep2", "--quiet"])
    assert r.exit_code == 0, r.output
    first, again = (json.loads((p / "eval.json").read_text()) for p in (tmp_path / "rep", tmp_path / "elsewhere" / "rep2"))
    assert again["checkpoints"][0]["loss"] == first["checkpoints"][0]["loss"] and str(a) in (tmp_path / "rep" / "eval.toml").read_text()


def test_a_node_without_rank_0_names_how_the_evaluation_ended(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """What a node without rank 0 prints from the report its own first rank handed back (lcft/launch/__main__.py
    adds its node_rank): done, or stopped by a signal with the signal's exit code; rank 0 printed the note of the
    losses it kept, a path on its own machine, on every node."""
    import lcft.launch

    a = save_model(tmp_path / "a", seed=1)
    args = ["eval", "--data", str(data_dir), "--checkpoint", str(a), "--out", str(tmp_path / "rep")]
    stopped = {"stopped": "signal", "signal": "SIGTERM", "signal_number": 15, "out": str(tmp_path / "rep"), "note": "losses kept in X"}
    for report, code, line in (({"node_rank": 1}, 0, "node 1: done; rank 0 wrote the report"),
                               ({**stopped, "node_rank": 1}, 143, "node 1: stopped by SIGTERM; rank 0 kept the losses"),
                               (stopped, 143, "losses kept in X")):
        monkeypatch.setattr(lcft.launch, "run", lambda *_a, report=report, **_k: report)
        r = runner.invoke(app, args)
        assert (r.exit_code, r.stdout.strip()) == (code, line), r.output


def test_a_char_models_export_evaluates_the_data_prepared_with_it(data_dir, tmp_path):  # noqa: F811
    """A model of lcft's char vocabulary, exported; held-out data prepared with the export as --tokenizer, as eval's
    advice on a tokenizer mismatch reads: eval takes it (the export's tokenizer.json was read as a 9-token kmer:1,
    and eval refused the data: 'dna-char with 16 tokens vs kmer:1 with 9 tokens'). The data is char's."""
    from lcft.genomics import sample_fasta

    export, held = tmp_path / "export", tmp_path / "held"
    for args in (["export", str(save_model(tmp_path / "a", seed=1)), "--out", str(export)],
                 ["prepare", "windows", "--fasta", str(sample_fasta()), "--out", str(held), "--length", str(WINDOW),
                  "--train", "chr2", "--eval", "chr22", "--max-n-frac", "0.6", "--tokenizer", str(export)],
                 ["eval", "--data", str(held), "-c", str(export), "--max-windows", "2", "--bins", "4",
                  "--out", str(tmp_path / "rep"), "--quiet"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args[0], r.output)
    for name in ("manifest.json", "eval.bin", "train.bin"):
        assert (held / name).read_bytes() == (data_dir / name).read_bytes(), name


def test_probe_options_without_the_probe_say_so_on_stderr(tmp_path, monkeypatch):
    """`--probe-segment 64 --probe-distances 128` without `--probe copy` ran no probe and said nothing; now one
    warning on stderr (stdout keeps the report), with --quiet too, and the evaluation runs as asked."""
    import lcft.launch

    ran = []
    monkeypatch.setattr(lcft.launch, "run", lambda _cmd, cfg, **_k: ran.append(cfg) or {"already": True})
    args = ["eval", "--data", str(tmp_path / "data"), "-c", str(tmp_path / "a"), "--out", str(tmp_path / "o"),
            "--probe-segment", "64", "--probe-distances", "128", "--quiet"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and r.stderr.splitlines() == [
        "warning: --probe-segment 64 and --probe-distances 128 have no effect without --probe copy: no copy probe runs"]
    assert len(ran) == 1 and ran[0].probe == "none"
    r = runner.invoke(app, [*args, "--probe", "copy"])
    assert r.exit_code == 0 and r.stderr == "", r.output
