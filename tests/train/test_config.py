"""TrainConfig: a docstring per field, defaults < TOML < flags, unknown keys named, sizes, RoPE scaling syntax,
and the CLI (`lcft train --config run.toml --flag ...`) resolving the same way."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.config import ConfigError, doc, load_toml
from lcft.train.config import TrainConfig, parse_rope_scaling, resolve_config
from lcft.train.metrics import read_metrics


def test_every_field_documented_and_has_a_flag():
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for f in dataclasses.fields(TrainConfig):
        assert doc(TrainConfig, f.name)
        assert "--" + f.name.replace("_", "-") in result.output, f.name


def test_precedence_and_unknown_keys(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('data = "d"\nout = "o"\nlr = 0.1\nsteps = 5\nseq_len = "8K"\n')
    cfg = resolve_config(toml, {"lr": "0.2", "steps": None, "micro_batch": "2"})
    assert (cfg.lr, cfg.steps, cfg.seq_len, cfg.micro_batch, cfg.global_batch) == (0.2, 5, 8192, 2, 8)
    toml.write_text('lr = 0.1\nwarm_up = 3\n')
    with pytest.raises(ConfigError, match="unknown train config key 'warm_up'.*'warmup'"):
        resolve_config(toml, {})
    with pytest.raises(ConfigError, match="precision: 'fp16' is not one of"):
        resolve_config(None, {"precision": "fp16"})


@pytest.mark.parametrize("text,expect", [
    ("yarn:8:64K", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 65536}),
    ("linear:4", {"rope_type": "linear", "factor": 4.0}),
    ('{"rope_type": "dynamic", "factor": 2.0}', {"rope_type": "dynamic", "factor": 2.0}),
    ("none", None),
])
def test_rope_scaling_syntax(text, expect):
    assert parse_rope_scaling(text) == expect


@pytest.mark.parametrize("bad", ["yarn", "cubic:2", "linear:x", "yarn:-1", "{not json"])
def test_rope_scaling_bad(bad):
    with pytest.raises(ConfigError, match="rope_scaling"):
        TrainConfig(rope_scaling=bad)


def test_cli_config_file_and_flags(tmp_path, base_cfg):
    """The TOML sets steps and lr; a flag overrides lr; the resolved config saved in the run says so."""
    toml = tmp_path / "run.toml"
    toml.write_text(f'data = "{base_cfg["data"]}"\ninit = "{base_cfg["init"]}"\nseq_len = 512\nsteps = 2\n'
                    'global_batch = 2\nlr = 0.5\nprecision = "fp32"\nsave_every = 0\nprogress = false\n')
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(toml), "--out", str(out), "--lr", "2e-3",
                                      "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert "done at step 2/2" in result.output
    saved = load_toml(out / "config.toml")
    assert saved["lr"] == 2e-3 and saved["steps"] == 2 and saved["warmup"] == 0 and saved["seq_len"] == 512
    assert read_metrics(out)[0]["lr"] == 2e-3  # warmup 0: the peak lr at once


def test_every_option_is_in_exactly_one_help_section():
    """`lcft train --help` lists the options in one panel per section; each option in the panel of its section."""
    import re

    from lcft.train.config import SECTIONS

    listed = [n for names in SECTIONS.values() for n in names]
    assert sorted(listed) == sorted(f.name for f in dataclasses.fields(TrainConfig))  # each once, none left out
    text = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output
    panels = {m.group(1).strip(): m.start() for m in re.finditer(r"╭─ ([^─]+) ─", text)}
    assert set(SECTIONS) <= set(panels), panels
    for section, names in SECTIONS.items():
        start = panels[section]
        end = min([p for p in panels.values() if p > start], default=len(text))
        for n in names:
            assert re.search(rf"--{n.replace('_', '-')}\b", text[start:end]), (section, n)
