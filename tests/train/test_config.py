"""TrainConfig: a docstring per field, defaults < TOML < flags, unknown keys named, sizes, RoPE scaling syntax,
and the CLI (`lcft train --config run.toml --flag ...`) resolving the same way."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.config import ConfigError, doc
from lcft.config_toml import load_toml
from lcft.train.config import TrainConfig, diff, parse_rope_scaling, resolve_config
from lcft.train.metrics import read_metrics


def test_every_field_documented_and_has_a_flag():
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for f in dataclasses.fields(TrainConfig):
        assert doc(TrainConfig, f.name)
        assert re.search(rf"--(\[no-\])?{f.name.replace('_', '-')}\b", result.output), f.name  # a flag: --[no-]x


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


@pytest.mark.parametrize("bad", ["yarn", "cubic:2", "linear:x", "yarn:-1", "yarn:0.5", "{not json",
                                 '{"a": ' + "[" * 10**5 + "]" * 10**5 + "}",  # past the JSON parser's recursion
                                 '{"a": ' + "[" * 150 + "]" * 150 + "}"])  # past lcft's bound on nesting
def test_rope_scaling_bad(bad):
    with pytest.raises(ConfigError, match="rope_scaling") as e:
        TrainConfig(rope_scaling=bad)
    assert "\n" not in str(e.value)


def _transformers_warns_of_the_factor(scaling: dict) -> bool:
    """Whether transformers' own RoPE validation (run as its LlamaConfig is built) says the factor must be >= 1."""
    transformers = pytest.importorskip("transformers")
    said: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = said.append
    log = logging.getLogger("transformers.modeling_rope_utils")
    level, log.level = log.level, logging.WARNING
    log.addHandler(handler)
    try:
        transformers.LlamaConfig(rope_scaling=dict(scaling), max_position_embeddings=4096)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return any("factor field must be a float or int >= 1" in r.getMessage() for r in said)


LLAMA3 = {"original_max_position_embeddings": 512, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize(("text", "scaling"), [
    ("yarn:0.5:512", {"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 512}),
    ("linear:0.5", {"rope_type": "linear", "factor": 0.5}),
    ("dynamic:0.99", {"rope_type": "dynamic", "factor": 0.99}),
    ('{"rope_type": "llama3", "factor": 0.25, "low_freq_factor": 1.0, "high_freq_factor": 4.0, '
     '"original_max_position_embeddings": 512}', {"rope_type": "llama3", "factor": 0.25, **LLAMA3}),
    ('{"type": "linear", "factor": 0}', {"type": "linear", "factor": 0}),
    ("yarn:1:512", {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 512}),
    ("linear:1", {"rope_type": "linear", "factor": 1.0}),
    ("dynamic:2", {"rope_type": "dynamic", "factor": 2.0}),
    ('{"rope_type": "llama3", "factor": 8, "low_freq_factor": 1.0, "high_freq_factor": 4.0, '
     '"original_max_position_embeddings": 512}', {"rope_type": "llama3", "factor": 8, **LLAMA3}),
])
def test_a_rope_scaling_factor_is_refused_where_transformers_says_it_must_be_at_least_1(text, scaling):
    """A factor below 1 (shrinking the context, not stretching it) is one line naming the option, for the
    TYPE:FACTOR and the JSON form alike; transformers' own validation is the oracle of which are bad."""
    if _transformers_warns_of_the_factor(scaling):
        with pytest.raises(ConfigError, match=r"^rope_scaling: the factor must be at least 1, got ") as e:
            TrainConfig(rope_scaling=text)
        assert "\n" not in str(e.value)
    else:
        TrainConfig(rope_scaling=text)


def test_rope_scaling_type_lists_only_the_kinds_that_take_a_factor():
    """'default' is plain RoPE, refused with a factor: the list of a bad type leaves it out."""
    with pytest.raises(ConfigError) as e:
        parse_rope_scaling("cubic:2")
    assert str(e.value) == "rope_scaling type: 'cubic' is not one of linear, dynamic, yarn, llama3"
    with pytest.raises(ConfigError, match=r"'default:2' is plain RoPE, written 'none'$"):
        parse_rope_scaling("default:2")


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
            assert re.search(rf"--(\[no-\])?{n.replace('_', '-')}\b", text[start:end]), (section, n)


def test_each_section_is_built_once_with_the_flat_values():
    """cfg.optim, cfg.guard, ... are the section dataclasses holding exactly their panel's options and the
    config's values; a section built alone refuses a value with the config's own message."""
    from lcft.train.config import SECTIONS, OptimConfig
    from lcft.train.guard import GuardConfig

    cfg = TrainConfig(data="d", lr=0.01, spike_window=7, cp=2, nproc=2, seed=3, top_k=4, tensorboard=True,
                      save_every=5, shard="fsdp", offload_params=True)
    assert [title for _, title, _ in TrainConfig.sections] == list(SECTIONS)
    for name, title, cls in TrainConfig.sections:
        section = getattr(cfg, name)
        assert type(section) is cls, name
        assert tuple(f.name for f in dataclasses.fields(section)) == SECTIONS[title]
        assert all(getattr(section, n) == getattr(cfg, n) for n in SECTIONS[title]), name
    assert (cfg.optim.lr, cfg.guard.spike_window, cfg.parallel.cp, cfg.launch.nproc, cfg.dataset.seed,
            cfg.model.top_k, cfg.logging.tensorboard, cfg.checkpoint.save_every) == (0.01, 7, 2, 2, 3, 4, True, 5)
    assert cfg.parallel is cfg.parallel  # built once, not per access
    assert dataclasses.replace(cfg, lr=0.5).optim.lr == 0.5  # a changed config builds its sections again
    for alone, whole, match in [(lambda: OptimConfig(steps=0), lambda: TrainConfig(steps=0), "steps must be at least 1"),
                                (lambda: GuardConfig(spike_sigma=float("nan")),
                                 lambda: TrainConfig(spike_sigma=float("nan")), "spike_sigma must be a finite number")]:
        for make in (alone, whole):
            with pytest.raises(ConfigError, match=match):
                make()


def test_a_flat_config_toml_loads_into_its_sections(tmp_path):
    """A run's config.toml keeps the flat keys (one per option, as every earlier version wrote them) and reads
    back into the same sections."""
    from lcft.config_toml import save_resolved, to_dict
    from lcft.train.config import load_run_config

    path = tmp_path / "config.toml"
    path.write_text('data = "/d"\nout = "/o"\nseq_len = 1024\nlr = 0.002\nwarmup = 0\ncp = 2\ncp_kv = "stream"\n'
                    'shard = "fsdp"\nnproc = 2\nspike_window = 9\nkeep_last = 1\nprogress = false\nattention = "sparse"\n')
    cfg = load_run_config(path)
    assert (cfg.dataset.seq_len, cfg.optim.lr, cfg.optim.warmup, cfg.parallel.cp_kv, cfg.parallel.shard,
            cfg.launch.nproc, cfg.guard.spike_window, cfg.checkpoint.keep_last, cfg.logging.progress,
            cfg.model.attention) == (1024, 0.002, 0, "stream", "fsdp", 2, 9, 1, False, "sparse")
    saved = to_dict(cfg)
    assert sorted(saved) == sorted(f.name for f in dataclasses.fields(TrainConfig))  # flat: no section tables
    save_resolved(tmp_path / "again.toml", saved)
    assert load_run_config(tmp_path / "again.toml") == cfg


def test_a_changed_option_left_unset_is_worded_as_its_default_never_none():
    """A resume without --seq-len after a run with --seq-len 3K said 'seq_len: 3072 -> None': an unset option is
    the default its help names, on either side of the change."""
    old = TrainConfig(seq_len=3072, attention="sparse").run_defining()
    new = TrainConfig(block_size=128).run_defining()
    assert diff(old, new) == ["attention: 'sparse' -> the default (the model's own, dense for a preset)",
                              "block_size: the default (the model's own, 64) -> 128",
                              "seq_len: 3072 -> the default (the window length)"]
    # every run-defining option that may be left unset names what it then is (none falls back to bare words)
    unset = {k: v for k, v in TrainConfig().run_defining().items() if v is None}
    assert {"seq_len", "init", "rope_theta", "rope_scaling", "top_k"} <= set(unset)
    lines = diff({k: 1 for k in unset}, unset)
    assert len(lines) == len(unset) and all(line.endswith(")") and "None" not in line for line in lines), lines
