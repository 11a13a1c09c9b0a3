"""The config plumbing: field docs, sizes, precedence, unknown keys, TOML round trip."""

import dataclasses
import os
import tomllib
from dataclasses import dataclass

import pytest

from lcft.config import ConfigError, doc, format_size, parse_size
from lcft.config_build import build, merge
from lcft.config_toml import dumps_toml
from tests.one_line import cli_fails


@dataclass
class _Cfg:
    length: int = 1024
    """Window length in tokens."""
    names: tuple[str, ...] = ("chr1", "chr2")
    """Chromosomes."""
    rate: float = 0.5
    """A rate."""
    flag: bool = False
    """A flag."""


def test_field_docs():
    assert doc(_Cfg, "length") == "Window length in tokens."
    assert doc(_Cfg, "names") == "Chromosomes."


@pytest.mark.parametrize("s,n", [("512K", 524288), ("1M", 1048576), ("1048576", 1048576), ("65536", 65536), (4096, 4096)])
def test_parse_size(s, n):
    assert parse_size(s) == n


@pytest.mark.parametrize("bad", ["", "abc", "1.5K7", "-3", "0"])
def test_parse_size_bad(bad):
    with pytest.raises(ConfigError):
        parse_size(bad)


def test_parse_size_is_exact_arithmetic():
    """A size as long as a user types it is read exactly (Fraction as the oracle): no float overflow to inf, no
    rounding of a long number, a fraction of a token refused, more digits than Python converts refused."""
    from fractions import Fraction

    huge = "9" * 400
    assert parse_size(huge + "K") == int(Fraction(huge) * 1024)
    assert parse_size("9007199254740993") == 9007199254740993  # 2**53 + 1: a float reads 2**53
    assert parse_size("1.5K") == 1536
    for bad in (huge + ".5", huge + ".3K", "9" * 5000):
        with pytest.raises(ConfigError, match="size"):
            parse_size(bad)


def test_format_size_roundtrip():
    for n in (1024, 524288, 1048576, 1000):
        assert parse_size(format_size(n)) == n


def test_precedence_and_unknown_key():
    toml = {"length": "2K", "rate": 0.1}
    flags = {"length": None, "rate": 0.2, "names": "chrA,chrB"}
    cfg = build(_Cfg, merge(toml, flags))
    assert cfg.length == 2048 and cfg.rate == 0.2 and cfg.names == ("chrA", "chrB") and cfg.flag is False
    assert build(_Cfg, {"length": "0"}).length == 0  # plain integers, zero included, are not sizes
    with pytest.raises(ConfigError, match="'lenght'"):
        build(_Cfg, {"lenght": 3})


def test_toml_roundtrip():
    data = {"a": 1, "b": "x", "c": [1, 2], "d": True, "e": None, "sec": {"f": 0.5, "g": {"h": "i"}}}
    back = tomllib.loads(dumps_toml(data))
    assert back == {"a": 1, "b": "x", "c": [1, 2], "d": True, "sec": {"f": 0.5, "g": {"h": "i"}}}


def test_shared_option_groups_are_declared_once_and_stay_flat(tmp_path):
    """nproc/cp/cp_layout/cp_kv live in ParallelConfig, the spike guard in GuardConfig; the configs that extend
    them keep the flat TOML keys and flags, and validate when built."""
    from lcft.evaluate.config import EvalConfig
    from lcft.parallel.config import ParallelConfig
    from lcft.train.config import TrainConfig, resolve_config
    from lcft.train.guard import GuardConfig

    for cls, group in ((TrainConfig, ParallelConfig), (EvalConfig, ParallelConfig), (TrainConfig, GuardConfig)):
        for name in (f.name for f in dataclasses.fields(group)):
            assert name not in cls.__dict__["__annotations__"], (cls, name)
            assert doc(cls, name) == doc(group, name)
    toml = tmp_path / "t.toml"
    toml.write_text('cp = 2\ncp_kv = "stream"\nspike_window = 7\n')
    cfg = resolve_config(toml, {"nproc": "4"})
    assert (cfg.cp, cfg.cp_kv, cfg.nproc, cfg.spike_window) == (2, "stream", 4, 7)
    assert build(EvalConfig, {"data": "d", "checkpoints": ["c"], "cp": "2"}).cp == 2
    for make, match in [(lambda: EvalConfig(data="d"), "no checkpoint given"),
                        (lambda: EvalConfig(data="d", checkpoints=("c",), cp=0), "cp must be at least 1"),
                        (lambda: TrainConfig(spike_window=0), "spike_window must be at least 1"),
                        (lambda: TrainConfig(global_batch=3, micro_batch=2), "not a multiple of micro_batch")]:
        with pytest.raises(ConfigError, match=match):
            make()


def test_each_enum_is_declared_once():
    """No two `Literal[...]` in the package spell out the same choices: each enum is one alias, imported where
    it is used (a second spelling would drift from the first)."""
    import ast
    from pathlib import Path

    import lcft

    seen: dict[frozenset, str] = {}
    for path in sorted(Path(lcft.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal"):
                continue
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = frozenset(i.value for i in items if isinstance(i, ast.Constant))
            where = f"{path.name}:{node.lineno}"
            assert values not in seen, f"{sorted(values)} declared at {seen.get(values)} and {where}"
            seen[values] = where
    assert len(seen) >= 10  # the scan saw the package's enums


@pytest.mark.parametrize("command", [["train", "--data", "d", "--out", "o"], ["eval", "--data", "d", "-c", "c",
                                     "--out", "o"], ["demo"]])
@pytest.mark.parametrize("seed", ["-1", str(1 << 63)])
def test_a_seed_numpy_or_torch_cannot_take_is_one_line(command, seed, tmp_path, monkeypatch):
    """numpy's generators refuse a negative seed (eval failed so after computing every loss) and torch one of
    2**64 or more: each command refuses it before any work."""
    monkeypatch.chdir(tmp_path)
    cli_fails([*command, "--seed", seed], "seed", "2**63")  # 2**63 is past every integer option's range
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_config_that_is_not_a_file_is_named_so(tmp_path, kind):
    path = tmp_path / "run.toml"
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    cli_fails(["plan", "--config", str(path)], f"config file is not a regular file: {path}")


def test_a_leading_tilde_is_the_home_folder_in_a_toml_and_after_an_equals_sign(tmp_path):
    """`~/...` in a --config TOML, or in `--out=~/x` (which the shell passes as it is), is the home folder, for
    every command as for train: never a FASTA not found, nor a folder named '~' made in the working folder."""
    import subprocess
    import sys
    from pathlib import Path

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    (work / "p.toml").write_text('fasta = "~/g.fa"\n[prepare]\nlength = 64\ntrain = ["chrA"]\neval = []\n')
    env = {**os.environ, "HOME": str(home), "LCFT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "lcft", "prepare", "windows", "--config", "p.toml", "--out=~/w"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (home / "w" / "manifest.json").is_file() and not (work / "~").exists()


COMMAND_TABLES = {("train",): "train", ("eval",): "eval", ("prepare", "windows"): "prepare", ("demo",): "demo",
                  ("plan",): "plan"}


@pytest.mark.parametrize("command", list(COMMAND_TABLES))
def test_one_config_file_holds_a_table_for_each_command(command, tmp_path):
    """A `--config` TOML with a [table] for every command: each command reads its own (the unknown key named is
    the one in its table) and passes over the others' (they were refused as unknown keys 'train', 'eval', ...); a
    top-level key no command knows is still refused, with the closest name."""
    toml = tmp_path / "all.toml"
    toml.write_text("".join(f"[{t}]\nout = \"o\"\nonly_in_{t} = 1\n" for t in COMMAND_TABLES.values()))
    own = COMMAND_TABLES[command]
    assert cli_fails([*command, "--config", str(toml)]) == f"error: unknown {own} config key 'only_in_{own}'"
    toml.write_text("outt = \"o\"\n" + "".join(f"[{t}]\nout = \"o\"\n" for t in COMMAND_TABLES.values()))
    said = cli_fails([*command, "--config", str(toml)])
    assert said == f"error: unknown {own} config key 'outt' (did you mean 'out'?)"
    import typer

    from lcft.cli.app import app
    from lcft.cli.generate import config_tables

    # every command's table, and no other (nor one of another CLI built in this process)
    assert sorted(config_tables(typer.main.get_command(app))) == sorted(COMMAND_TABLES.values())


@pytest.mark.parametrize("command", list(COMMAND_TABLES))
@pytest.mark.parametrize("table,said", [
    ("trian", "unknown config table [trian] (did you mean [train]?)"),
    ("prepar", "unknown config table [prepar] (did you mean [prepare]?)"),
    ("zzz", "unknown config table [zzz]: the tables are [demo], [eval], [plan], [prepare], [train]"),
])
def test_a_misspelt_table_names_the_table_meant(command, table, said, tmp_path):
    """`[trian]` in a --config file is a table no command reads: every command says so and names the table meant
    (not a field: prepare has fields `train` and `eval`, lists of chromosomes), or lists the tables."""
    toml = tmp_path / "typo.toml"
    toml.write_text(f"[{table}]\nout = \"o\"\n")
    assert cli_fails([*command, "--config", str(toml)]) == f"error: {said}"


def test_a_field_given_a_table_is_the_fields_error_not_a_misspelt_table(tmp_path):
    """`rope_scaling = {rope_type = "yarn", factor = 8.0}` (transformers' form) is a field given a table: the
    field's own check says what it takes (it was called an unknown config table)."""
    toml = tmp_path / "rs.toml"
    toml.write_text('rope_scaling = {rope_type = "yarn", factor = 8.0}\n')
    assert cli_fails(["train", "--config", str(toml), "--data", "d", "--out", "o"]) == \
        "error: rope_scaling: expected a string, got a table"


def test_a_config_file_of_several_tables_resolves_from_python(tmp_path):
    """`resolve_config` (the Python API) reads its [train] table and passes over the other commands' ones, as
    `lcft train --config` does; a misspelt table is for the CLI, which knows the commands, to name."""
    from lcft.train.config import resolve_config

    toml = tmp_path / "two.toml"
    toml.write_text("[train]\nsteps = 3\n[eval]\nbins = 4\n")
    assert resolve_config(toml, {"data": "d", "out": "o"}).steps == 3


def test_train_prepare_and_eval_make_paths_absolute_by_one_rule(tmp_path, monkeypatch):
    """From a working folder, every command's config names absolute paths, existing or not (an output is made
    later): eval's as resolved for its launched processes, train's, prepare's prepare.toml; a Hub id, --resume
    auto and the built-in tokenizer char stay as written, even with a folder named char in the working folder."""
    from lcft.config_toml import load_toml
    from lcft.evaluate import EvalConfig
    from lcft.genomics import prepare_windows
    from lcft.launch.jobs import job
    from lcft.train import TrainConfig
    from lcft.train.config import resolve_folders

    monkeypatch.chdir(tmp_path)
    ev = job("eval").entry().resolve(EvalConfig(data="d", checkpoints=("ck", "org/model"), out="rep"))
    assert (ev.data, ev.checkpoints, ev.out) == (str(tmp_path / "d"), (str(tmp_path / "ck"), "org/model"),
                                                 str(tmp_path / "rep"))
    tr = resolve_folders(TrainConfig(data="d", out="r", init="org/model", resume="auto"))
    assert (tr.data, tr.out, tr.init, tr.resume) == (str(tmp_path / "d"), str(tmp_path / "r"), "org/model", "auto")
    (tmp_path / "char").mkdir()
    (tmp_path / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    prepare_windows(fasta="g.fa", out="w", length=64, train=("chrA",), eval=(), tokenizer="char")
    saved = load_toml(tmp_path / "w" / "prepare.toml")
    assert (saved["fasta"], saved["out"], saved["tokenizer"]) == (str(tmp_path / "g.fa"), str(tmp_path / "w"), "char")
