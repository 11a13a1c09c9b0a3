"""The command generator: one flag per field, defaults < --config TOML (flat or [table]) < flags, help text."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

import pytest
import typer
from typer.testing import CliRunner

from lcft.cli.app import app as lcft_app
from lcft.cli.generate import PROGRESS, Extra, Opt, command_from_config
from lcft.config import ConfigError, Size
from lcft.evaluate.config import EvalConfig
from lcft.genomics.prepare_config import PrepareConfig
from lcft.recipes.demo import DemoConfig
from lcft.train.config import TrainConfig

runner = CliRunner()


@dataclass
class _Base:
    shared: int = 1
    """An option of a shared group."""


@dataclass
class _Cfg(_Base):
    length: Size = 4096
    """Tokens per piece."""
    names: tuple[str, ...] = ("a", "b")
    """Names, comma separated."""
    paths: tuple[str, ...] = ()
    """Paths."""
    mode: Literal["x", "y"] = "x"
    """A mode."""
    rate: float = 0.5
    """A rate."""
    flag: bool = True
    """A switch."""

    def __post_init__(self) -> None:
        if self.rate > 1:
            raise ConfigError(f"rate must be at most 1 (got {self.rate})")


def _app(seen: list) -> typer.Typer:
    app = typer.Typer()
    command_from_config(app, "go", _Cfg, lambda cfg, quiet: seen.append((cfg, quiet)), help="Go.",
                        options={"names": Opt(commas=True), "paths": Opt(flag="--path", aliases=("-p",)),
                                 "length": Opt(once="give their sum")},
                        extras={"quiet": Extra(("--quiet", "-q"), "Quiet.")})

    @app.command("other")
    def _other() -> None:  # a second command, so typer keeps `go` as a subcommand
        """Nothing."""

    return app


def test_defaults_toml_flags_precedence(tmp_path):
    seen: list = []
    toml = tmp_path / "c.toml"
    toml.write_text('rate = 0.25\nmode = "y"\nshared = 7\n[go]\nlength = "8K"\nrate = 0.75\n')
    r = runner.invoke(_app(seen), ["go", "--config", str(toml), "--rate", "0.1", "--names", "p,q", "-p", "a/1",
                                   "--path", "b,2", "--no-flag", "-q"])
    assert r.exit_code == 0, r.output
    cfg, quiet = seen[-1]
    expected = _Cfg(shared=7, length=8192, names=("p", "q"), paths=("a/1", "b,2"), mode="y", rate=0.1, flag=False)
    assert cfg == expected and quiet is True  # [go] beats the flat keys; flags beat both; -p keeps its comma
    r = runner.invoke(_app(seen), ["go"])
    assert r.exit_code == 0 and seen[-1] == (_Cfg(), False)


def test_unknown_key_bad_value_and_failed_check_are_one_line_errors(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("lenght = 3\n")
    for args, msg in [(["--config", str(toml)], "unknown go config key 'lenght'"),
                      (["--mode", "z"], "mode: 'z' is not one of x, y"), (["--rate", "2"], "rate must be at most 1")]:
        r = runner.invoke(_app([]), ["go", *args])
        assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output, r.output


def test_an_option_of_one_value_given_twice_is_refused_in_one_line(tmp_path):
    """click kept the last of a repeated option: `--fasta a.fa --fasta b.fa` read b.fa alone and said only that
    chr2 (in a.fa) was not found. An option of one value, generated or written by hand, is refused when repeated
    (with the field's `once` text; a comma-list option's says to join them); repeatable options and --x/--no-x
    flags (the last one wins) are not."""
    seen: list = []
    toml = tmp_path / "c.toml"
    toml.write_text("rate = 0.25\n")
    for args, said in [(["--rate", "0.1", "--rate", "0.2"], "--rate is given 2 times; it takes one value"),
                       (["--length", "1K", "--rate=1", "--length=2K", "--length", "3"],
                        "--length is given 3 times; it takes one value: give their sum"),
                       (["--config", str(toml), "--config", str(toml)], "--config is given 2 times; it takes one value"),
                       (["--names", "a", "--names", "b"],
                        "--names is given 2 times; it takes one value: give several comma separated, as --names a,b")]:
        r = runner.invoke(_app(seen), ["go", *args])
        assert (r.exit_code, r.stderr, seen) == (1, f"error: {said}\n", []), r.output
    r = runner.invoke(_app(seen), ["go", "-p", "a", "--path", "b", "--no-flag", "--flag", "-q", "-q"])
    assert r.exit_code == 0 and seen == [(_Cfg(paths=("a", "b"), flag=True), True)], r.output
    for args, said in [
        (["prepare", "windows", "--fasta", "chr2.fa.gz", "--fasta", "chr22.fa", "--out", tmp_path / "w"],
         "--fasta is given 2 times; it takes one value: to cut several FASTA files, concatenate them into one: "
         "`cat a.fa b.fa > ab.fa` (gzip files as they are: `cat a.fa.gz b.fa.gz > ab.fa.gz`)"),
        (["prepare", "windows", "--train", "chr1", "--train", "chr2", "--out", tmp_path / "w"],
         "--train is given 2 times; it takes one value: give several comma separated, as --train a,b"),
        (["prepare", "fetch", "--url", "http://a/x.fa.gz", "--url", "http://b/x.fa.gz"],
         "--url is given 2 times; it takes one value"),
        (["export", "run", "-o", tmp_path / "a", "--out", tmp_path / "b"], "--out is given 2 times; it takes one value"),
    ]:
        r = runner.invoke(lcft_app, [str(a) for a in args])
        assert (r.exit_code, r.stderr) == (1, f"error: {said}\n"), r.output
    assert list(tmp_path.iterdir()) == [toml]  # refused before any folder was made


def test_help_shows_docstrings_and_defaults_as_typed():
    r = runner.invoke(_app([]), ["go", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for text in ("Tokens per piece. (default: 4K)", "Names, comma separated. (default: a,b)", "--path", "-p",
                 "Paths. Repeat the option.", "x|y", "SIZE", "(default: on)", "--[no-]flag", "An option of a shared"):
        assert text in r.output, text
    assert r.output.index("--length") < r.output.index("--shared")  # own options before the shared group


@pytest.mark.parametrize("cmd,cls,renamed", [
    (["train"], TrainConfig, {}),
    (["eval"], EvalConfig, {"checkpoints": "--checkpoint", "labels": "--label"}),
    (["prepare", "windows"], PrepareConfig, {}),
    (["demo"], DemoConfig, {"num_hidden_layers": "--layers", "num_attention_heads": "--heads"}),
])
def test_every_config_field_has_its_flag(cmd, cls, renamed):
    r = runner.invoke(lcft_app, [*cmd, "--help"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    for f in dataclasses.fields(cls):
        flag = renamed.get(f.name, "--" + f.name.replace("_", "-"))
        assert (flag if f.type not in (bool, "bool") else "--[no-]" + flag[2:]) in r.output, f.name


def test_size_defaults_are_shown_as_sizes():
    r = runner.invoke(lcft_app, ["prepare", "windows", "--help"], env={"COLUMNS": "250"})
    assert "(default: 512K)" in r.output and "(default: chr1,chr2)" in r.output
    r = runner.invoke(lcft_app, ["demo", "--help"], env={"COLUMNS": "250"})
    assert "(default: 32K)" in r.output and "(default: 1K)" in r.output


@pytest.mark.parametrize("argv, shown", [(["eval", "--help"], ["under its [eval] table", "ORG/NAME[@REVISION]"]),
                                         (["train", "--help"], ["ORG/NAME[@REVISION]"]),
                                         (["export", "--help"], ["ORG/NAME[@REVISION]"])])
def test_help_keeps_square_brackets(argv, shown):
    """Rich reads [..] in help text as markup and drops it: a TOML table's name and a Hub id's optional
    revision were missing from --help."""
    out = " ".join(runner.invoke(lcft_app, argv, env={"COLUMNS": "400"}).output.split())
    assert all(s in out for s in shown), out


def _commands(cmd, path: tuple[str, ...] = ()):
    """Every command of the CLI below `cmd`, with the words that name it."""
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
    for name, sub in (subs or {}).items():
        yield from _commands(sub, (*path, name))


def _shown_names(param) -> list[str]:
    """The names --help shows for an option: a flag --x with --no-x as --[no-]x, any other name as it is; for an
    argument none but its metavar."""
    if param.param_type_name == "argument":
        return []
    return ["--[no-]" + n[2:] if "--no-" + n[2:] in param.secondary_opts else n for n in param.opts] + [
        n for n in param.secondary_opts if n.removeprefix("--no-") not in {o[2:] for o in param.opts}]


def test_every_option_name_is_whole_in_help_at_80_columns():
    """At 80 columns typer gave --x and --no-x a column each and long a|b|c metavars a third: the names were cut
    ('--offload-activa…', '--no-offload-ac…'), metavars split over lines, and eval's help text got 17 columns."""
    commands = list(_commands(typer.main.get_command(lcft_app)))
    assert len(commands) >= 9  # train, plan, eval, export, demo, prepare windows/verify/inspect/fetch/cache
    for path, cmd in commands:
        out = runner.invoke(lcft_app, [*path, "--help"], env={"COLUMNS": "80"}).output
        assert "…" not in out and max(map(len, out.splitlines())) <= 80, (path, out)
        for p in cmd.params:
            if getattr(p, "hidden", False) or not hasattr(p, "secondary_opts"):
                continue
            for word in [*_shown_names(p), *([p.metavar] if p.metavar else [])]:
                assert re.search(rf"(?<![\w\[\]|-]){re.escape(word)}(?![\w\[\]|-])", out), (path, word, out)
        for line in out.splitlines():
            if "--config " in line:  # the help text of every row starts in this column
                assert 80 - line.index("TOML file") - 2 >= 24, (path, line)


@dataclass
class _Choices:
    layout: Literal["zigzag", "contiguous"] = "zigzag"
    """How tokens are split."""
    kv: Literal["all", "selected", "stream"] = "all"
    """K/V exchange: 'all', 'selected' or 'stream'."""


def test_a_long_choice_list_is_named_in_the_help_text_once():
    """A choice list wider than the metavar column shows CHOICE; the help names the choices where its text does
    not already."""
    app = typer.Typer()
    command_from_config(app, "go", _Choices, lambda cfg: None, help="Go.")
    app.command("other")(lambda: None)
    out = " ".join(runner.invoke(app, ["go", "--help"], env={"COLUMNS": "200"}).output.split())
    assert out.count("CHOICE") == 2 and "zigzag|contiguous" not in out, out
    assert "How tokens are split. One of: zigzag, contiguous. (default: zigzag)" in out, out
    assert "'all', 'selected' or 'stream'. (default: all)" in out and out.count("One of:") == 1, out


@pytest.mark.parametrize("columns", ["80", "120"])
def test_help_shows_a_value_in_upper_case_and_no_type_for_a_flag(columns):
    """Every command's and group's help names what an option or argument takes in upper case (its metavar, else
    TEXT, PATH, ...) and nothing for a plain flag: typer's `<str>`, `<path>` and `<bool>` (on --force, --help,
    --[no-]progress) stood beside PATH, DIR and CHOICE."""
    from typer.core import TyperArgument

    for path, cmd in _commands(typer.main.get_command(lcft_app)):
        out = runner.invoke(lcft_app, [*path, "--help"], env={"COLUMNS": columns}).output
        assert not re.search(r"<(str|path|bool|int|float)>", out), (path, out)
        assert re.search(r"│ +--help +Show this message", out), (path, out)
        for p in cmd.params:
            names = [p.display_name_raw] if isinstance(p, TyperArgument) else _shown_names(p)
            row = re.search(rf"│[ *]{{1,6}}{re.escape(names[0])}(?: +-\w)? +(\S+) +(\S+)", out)
            assert row, (path, names, out)
            first = (p.help or "").split()[0]
            if getattr(p, "is_flag", False):
                assert row.group(1) == first, (path, names, row.group(0))
            else:  # the metavar an option was given, else an upper-case type name; a choice list as a|b
                word = p.metavar if p.metavar and not isinstance(p, TyperArgument) else row.group(1)
                assert row.group(1) == word and (word.isupper() or "|" in word), (path, names, row.group(0))


def test_a_commands_help_wraps_as_whole_paragraphs():
    """A docstring's line breaks are the source's, not the help's: typer's rich help kept them, and `lcft prepare
    --help` broke the fetch and cache entries mid-sentence where their source lines ended."""
    for path, cmd in _commands(typer.main.get_command(lcft_app)):
        for paragraph in (cmd.help or "").split("\n\n"):
            assert "\n" not in paragraph, (path, paragraph)
    out = runner.invoke(lcft_app, ["prepare", "--help"], env={"COLUMNS": "80"}).output
    rows = [ln.strip("│ ") for ln in out.splitlines()]
    assert "hg38.fa.gz becomes hg38.fa" in " ".join(rows), out
    fetch = rows.index(next(r for r in rows if r.startswith("fetch ")))
    assert all(len(r) >= 55 for r in rows[fetch:fetch + 3]), out  # each line filled (before: 72, 39 and 61)


def test_a_command_passes_over_the_tables_of_its_own_cli_only(tmp_path):
    """The tables a command passes over are those of the commands of the CLI it runs in, each named where it is
    built: here [go] and [else]; lcft's commands refuse [go] (another CLI built in this process adds none)."""
    seen: list = []
    app = _app(seen)
    command_from_config(app, "again", _Base, seen.append, help="Again.", table="else")
    toml = tmp_path / "both.toml"
    toml.write_text("[go]\nrate = 0.25\n[else]\nshared = 3\n")
    assert runner.invoke(app, ["go", "--config", str(toml)]).exit_code == 0 and seen[-1][0].rate == 0.25
    assert runner.invoke(app, ["again", "--config", str(toml)]).exit_code == 0 and seen[-1].shared == 3
    said = runner.invoke(lcft_app, ["train", "--config", str(toml)]).output.strip()
    assert said == "error: unknown config table [go]: the tables are [demo], [eval], [plan], [prepare], [train]"


@pytest.mark.parametrize("args, expected", [([], False), (["--progress"], True)])
def test_a_progress_bar_set_in_the_config_table(tmp_path, args, expected):
    """`progress` (not a config field of eval or demo) in their --config table, as in [train]; a flag wins; the
    config built is the same as without it."""
    seen: list = []
    app = typer.Typer()
    command_from_config(app, "go", _Base, lambda cfg, progress: seen.append((cfg, progress)), help="Go.",
                        extras={"progress": PROGRESS})
    app.command("other")(lambda: None)
    toml = tmp_path / "c.toml"
    toml.write_text("[go]\nprogress = false\nshared = 3\n")
    r = runner.invoke(app, ["go", "--config", str(toml), *args])
    assert r.exit_code == 0, r.output
    assert seen == [(_Base(shared=3), expected)]
    toml.write_text('[go]\nprogress = "no"\n')
    r = runner.invoke(app, ["go", "--config", str(toml)])
    assert r.exit_code == 1 and "go config key 'progress' must be bool, not str 'no'" in r.output, r.output


@pytest.mark.parametrize("command", ["eval", "demo"])
def test_eval_and_demo_take_progress_from_their_config_table(tmp_path, command):
    """The option `lcft eval --help` and `lcft demo --help` list is a key of their --config table: the command
    goes on to its own checks (here: the missing data, a step count below 1), not 'unknown config key'."""
    toml = tmp_path / "c.toml"
    toml.write_text(f"[{command}]\nprogress = false\n")
    missing = str(tmp_path / "missing")
    args = ["--data", missing, "--checkpoint", missing] if command == "eval" else ["--steps", "-1"]
    r = runner.invoke(lcft_app, [command, "--config", str(toml), *args, "--out", str(tmp_path / "out")])
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and "progress" not in r.stderr, r.output


def test_every_argument_is_named_in_capitals_in_the_usage_line():
    """An argument shows in `Usage:` as its metavar (typer braces a required one): DIR, PATH, CHECKPOINT, as the
    options' metavars read, not the Python parameter's name."""
    for path, cmd in _commands(typer.main.get_command(lcft_app)):
        out = runner.invoke(lcft_app, [*path, "--help"], terminal_width=200).output
        usage = next(line for line in out.splitlines() if "Usage:" in line)
        for p in cmd.params:
            if p.param_type_name == "argument":
                assert p.metavar and p.metavar.isupper() and p.metavar in usage, (path, p.name, usage)
