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


def test_a_misspelt_export_dtype_is_the_one_choice_check(tmp_path):
    """`lcft export --dtype` is checked as every choice is (lcft.config.check_choice): the close match named,
    before the checkpoint is read or --out made."""
    cli_fails(["export", str(tmp_path), "--out", str(tmp_path / "hf"), "--dtype", "bfloat61"],
              "error: --dtype: 'bfloat61' is not one of float32, bfloat16, float16 (did you mean 'bfloat16'?)")
    assert not (tmp_path / "hf").exists()
