"""Config errors name each option as the user gave it: its flag on the command line, its key in a --config TOML."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.cli.generate import Opt, as_given
from lcft.genomics.prepare_config import PrepareConfig

runner = CliRunner()


def error_of(*args: object) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.output
    return r.stderr.strip()


def prepare(tmp_path, *extra: object) -> list[object]:
    return ["prepare", "windows", "--fasta", tmp_path / "g.fa", "--out", tmp_path / "w", *extra]


def test_prepare_names_the_flag_or_the_toml_key(tmp_path) -> None:
    assert error_of(*prepare(tmp_path, "--max-n-frac", "10")) == "error: --max-n-frac 10.0 must be between 0 and 1"
    toml = tmp_path / "p.toml"
    toml.write_text("[prepare]\nmax_n_frac = 10.0\n")
    assert error_of(*prepare(tmp_path, "--config", toml)) == "error: max_n_frac 10.0 must be between 0 and 1"
    # the flag wins over the TOML: the message names what set the value
    assert error_of(*prepare(tmp_path, "--config", toml, "--max-n-frac", "2")).startswith("error: --max-n-frac 2.0")


def test_eval_choice_and_range_errors(tmp_path) -> None:
    ev = ["eval", "--data", tmp_path / "d", "-c", tmp_path / "m", "--out", tmp_path / "o"]
    assert error_of(*ev, "--bin-scale", "lin").startswith("error: --bin-scale: 'lin' is not one of linear, log")
    toml = tmp_path / "e.toml"
    toml.write_text('[eval]\nbin_scale = "lin"\nbins = 0\n')
    assert error_of(*ev, "--config", toml).startswith("error: bin_scale: 'lin' is not one of linear, log")
    # a check written with the flag (--bins) names the TOML key when the TOML set it, and the flag otherwise
    assert error_of(*ev, "--config", toml, "--bin-scale", "log").startswith("error: bins must be between 1 and")
    assert error_of(*ev, "--config", toml, "--bin-scale", "log", "--bins", "0").startswith("error: --bins must be")


def test_train_batch_check_names_both_options_as_given(tmp_path) -> None:
    train = ["train", "--data", tmp_path / "d", "--out", tmp_path / "r", "--micro-batch", "2"]
    assert error_of(*train, "--global-batch", "3") == ("error: --global-batch 3 is not a multiple of --micro-batch "
                                                       "x data-parallel ranks (2 x 1): 2 or 4 would split")
    toml = tmp_path / "t.toml"
    toml.write_text("[train]\nglobal_batch = 3\n")
    assert error_of(*train, "--config", toml) == ("error: global_batch 3 is not a multiple of --micro-batch x "
                                                  "data-parallel ranks (2 x 1): 2 or 4 would split")


@pytest.mark.parametrize("message,flags,toml,want", [
    ("stride 0 must be positive", {"stride": 0}, {}, "--stride 0 must be positive"),
    ("stride 0 must be positive", {}, {"stride": 0}, "stride 0 must be positive"),
    # a one-word name inside prose is a word, not the option
    ("window length 4 must be a multiple of 8", {"length": 4}, {}, "window length 4 must be a multiple of 8"),
    # quoted values and paths are the user's text, left as written
    ("tokenizer: 'max_n_frac' is not a file", {"tokenizer": "max_n_frac"}, {}, "--tokenizer: 'max_n_frac' is not a file"),
    ("cannot read /tmp/max_n_frac/g.fa (max_n_frac.toml)", {}, {}, "cannot read /tmp/max_n_frac/g.fa (max_n_frac.toml)"),
    ("max_n_frac and max_oov_frac.", {"max_n_frac": 1}, {"max_oov_frac": 1}, "--max-n-frac and max_oov_frac."),
])
def test_as_given(message: str, flags: dict, toml: dict, want: str) -> None:
    assert as_given(message, PrepareConfig, {}, flags, toml) == want


def test_as_given_uses_a_renamed_flag() -> None:
    from lcft.evaluate.config import EvalConfig

    opts = {"labels": Opt(flag="--label"), "checkpoints": Opt(flag="--checkpoint")}
    assert as_given("2 --label for 1 --checkpoint", EvalConfig, opts, {}, {"labels": ["a", "b"]}) == \
        "2 labels for 1 --checkpoint"


def test_every_progress_bar_is_switched_by_the_same_option() -> None:
    """train's live view and eval's and demo's progress bars are each turned off with --no-progress (eval and demo
    had only --quiet for it)."""
    import typer

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("train", "eval", "demo"):
        progress = {p.name: p for p in commands[name].params}["progress"]
        assert (progress.opts, progress.secondary_opts, progress.default) == (["--progress"], ["--no-progress"],
                                                                              None if name == "train" else True)


@pytest.mark.parametrize("command,flags,shown", [
    *[(c, f, on) for c in ("eval", "demo") for f, on in (([], True), (["--no-progress"], False), (["--progress"], True))],
    ("eval", ["--quiet"], False), ("eval", ["--progress", "-q"], False)])
def test_no_progress_turns_the_bars_off(command, flags, shown, monkeypatch, tmp_path) -> None:
    """What the command hands its job: eval's --quiet (nothing on stdout) still turns its bar off too."""
    import lcft.launch
    import lcft.recipes.demo
    from lcft.errors import LcftError

    seen = []

    def job(*args, progress, **kwargs):
        seen.append(progress)
        raise LcftError("stopped before any work")

    monkeypatch.setattr(lcft.launch, "run", job)
    monkeypatch.setattr(lcft.recipes.demo, "run_demo", job)
    args = ["--data", "d", "--checkpoint", "c"] if command == "eval" else []
    r = runner.invoke(app, [command, *args, "--out", str(tmp_path / "o"), *flags])
    assert seen == [shown] and "stopped before any work" in r.output, r.output
