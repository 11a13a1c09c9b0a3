"""Bad numbers and TOML types are refused before any work, with a one-line error naming the option."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.config import ConfigError
from lcft.parallel.config import MAX_COLLECTIVE_TIMEOUT
from lcft.train import TrainConfig
from lcft.train.config import resolve_config

runner = CliRunner()


@pytest.mark.parametrize("flag,value", [
    ("--lr", "inf"), ("--lr", "nan"), ("--z-loss", "nan"), ("--adam-beta2", "1.5"), ("--adam-beta1", "-0.1"),
    ("--adam-eps", "0"), ("--grad-clip", "-inf"), ("--spike-sigma", "nan"), ("--min-lr-ratio", "1.5"),
    ("--rope-theta", "0"), ("--seed", "-1"), ("--seed", str(1 << 63)),
])
def test_bad_numbers_refused_before_any_work(tmp_path, flag, value):
    """The CLI exits 1 with one line naming the option as typed, and writes no run folder."""
    out = tmp_path / "run"
    r = runner.invoke(app, ["train", "--data", str(tmp_path / "nodata"), "--out", str(out), flag, value])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert re.match(rf"error: {flag}\b(?!-)", text) and "Traceback" not in r.output, text
    assert not out.exists()


@pytest.mark.parametrize("name,value", [("lr", float("inf")), ("z_loss", float("nan")), ("adam_beta2", 1.0),
                                        ("weight_decay", float("nan")), ("rope_theta", -1.0)])
def test_bad_numbers_refused_when_built_in_python(name, value):
    with pytest.raises(ConfigError, match=name):
        TrainConfig(data="d", out="o", **{name: value})


@pytest.mark.parametrize("name,limit,word", [
    ("seq_len", 2**34, "17,179,869,184 (lcft's limit of positions)"),  # max_position_embeddings' limit
    ("micro_batch", 2**31, "2,147,483,648 (lcft's limit of sequences in a batch)"),
    ("global_batch", 2**31, "2,147,483,648 (lcft's limit of sequences in a batch)"),
    ("nproc", 2**20, "1,048,576 (lcft's limit of processes or nodes)"),
])
def test_counts_are_bounded_above(name, limit, word):
    """A count no run reaches is refused by name (a seq_len of 331 digits overflowed a float in the plan's
    estimate; 10**320 processes were planned as fitting); the limit itself is accepted."""
    base = {"micro_batch": 1, "global_batch": 2**31} if "batch" in name else {}  # a valid batch at the limit
    assert getattr(TrainConfig(data="d", out="o", **{**base, name: limit}), name) == limit
    for value in (limit + 1, 10**330):
        with pytest.raises(ConfigError, match=re.escape(f"{name} must be at most {word}, got {value}")):
            TrainConfig(data="d", out="o", **{**base, name: value})


@pytest.mark.parametrize("line,word", [
    ("steps = 1.7", "steps"), ('data = ["a", "b"]', "data"), ("lr = nan", "lr"), ("lr = inf", "lr"),
    ('steps = "many"', "steps"), ("progress = 3", "progress"), ("seq_len = 512.5", "seq_len"),
    ("global_batch = true", "global_batch"), ('precision = ["fp32"]', "precision"),
])
def test_toml_values_checked_like_flags(tmp_path, line, word):
    """`steps = 1.7` is not truncated to 1, a list for a path is not a traceback: ConfigError naming the key."""
    toml = tmp_path / "run.toml"
    toml.write_text(line + "\n")
    with pytest.raises(ConfigError, match=word):
        resolve_config(toml, {})


@pytest.mark.parametrize("line,word", [
    (f"steps = {10**30}", "steps: 1000000000000000000000000000000 is past the 64-bit range"),
    (f"save_every = {-2**63 - 1}", "save_every: -9223372036854775809 is past the 64-bit range"),
    ('warmup = "9000000000G"', "warmup: 9663676416000000000 is past the 64-bit range"),  # a size past it too
    ("collective_timeout = 1e300", "collective_timeout must be a positive number of seconds, at most 2,592,000"),
])
def test_toml_numbers_are_bounded(tmp_path, line, word):
    """An integer option no 64-bit count holds, and a collective timeout torch's process group cannot take as a
    timedelta (1e300 s: an OverflowError in every rank), are refused by name."""
    toml = tmp_path / "run.toml"
    toml.write_text(line + "\n")
    with pytest.raises(ConfigError, match=re.escape(word)):
        resolve_config(toml, {"data": "d", "out": "o"})


def test_the_bounds_themselves_are_taken():
    """2**63 - 1 steps and the longest collective timeout are accepted, and torch's group can wait that long."""
    toml_cfg = TrainConfig(data="d", out="o", steps=2**63 - 1, collective_timeout=MAX_COLLECTIVE_TIMEOUT)
    assert toml_cfg.steps == 2**63 - 1
    assert timedelta(seconds=toml_cfg.collective_timeout).days == 30


@pytest.mark.parametrize("line,said", [
    ("seq_len = \"1e6\"", "seq_len: not an integer: '1e6' (a size: e.g. 65536, 512K, 1M)"),
    ("seq_len = \"2Ki\"", "seq_len: not an integer: '2Ki' (a size: e.g. 65536, 512K, 1M)"),
    ("steps = \"1e3\"", "steps: not an integer: '1e3'"),  # a count, not a size: no size hint
])
def test_a_size_not_written_as_one_says_how_sizes_are_written(tmp_path, line, said):
    toml = tmp_path / "run.toml"
    toml.write_text(line + "\n")
    with pytest.raises(ConfigError) as e:
        resolve_config(toml, {"data": "d", "out": "o"})
    assert str(e.value) == said


def test_toml_good_values_still_accepted(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('steps = 7\nlr = 1e-3\nseq_len = "1K"\nwarmup = 0\nprogress = false\nadam_beta2 = 0.99\n')
    cfg = resolve_config(toml, {"data": "d", "out": "o"})
    assert (cfg.steps, cfg.lr, cfg.seq_len, cfg.warmup, cfg.progress, cfg.adam_beta2) == (7, 1e-3, 1024, 0, False, 0.99)
