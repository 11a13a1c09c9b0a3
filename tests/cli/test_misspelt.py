"""A misspelt choice or --config key is one line naming the close match, before anything is written."""

from __future__ import annotations

import pytest

from tests.one_line import cli_fails


@pytest.mark.parametrize(("args", "needle"), [
    (["--precision", "bf61"], "precision: 'bf61' is not one of auto, fp32, bf16 (did you mean 'bf16'?)"),
    (["--attention", "sparce"], "(did you mean 'sparse'?)"),
    (["--config", "TOML"], "unknown train config key 'precison' (did you mean 'precision'?)"),
])
def test_a_misspelt_choice_or_config_key_names_the_close_match(args, needle, tmp_path):
    (tmp_path / "c.toml").write_text('precison = "fp32"\n')
    args = [str(tmp_path / "c.toml") if a == "TOML" else a for a in args]
    cli_fails(["train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), *args], needle)
    assert not (tmp_path / "run").exists()
