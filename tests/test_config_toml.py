"""Paths a saved config must hold: a name whose bytes are not text (not UTF-8, or not the locale's encoding) is
one line before any work; the saved config.toml of such a run could never be read back (a resume, --config)."""

from __future__ import annotations

import os
import tomllib

import pytest

from lcft.config import ConfigError
from lcft.config_toml import absolute_paths, dumps_toml, to_dict
from lcft.train.config import TrainConfig
from tests.one_line import one_line


@pytest.mark.parametrize("name, needles", [
    (b"run-\xff", ("not valid UTF-8", "rename")),
    # é's UTF-8 bytes in a process whose locale is ASCII (LC_ALL=C, PYTHONUTF8=0) come as two surrogates, too
    (b"run-\xc3\xa9", ("locale's encoding", "PYTHONUTF8=1")),
])
def test_a_name_a_saved_config_cannot_hold_is_one_line(tmp_path, name, needles):
    """It trained, then every resume failed: 'config.toml: not valid TOML (Escaped character is not a Unicode
    scalar value)'."""
    out = str(tmp_path) + "/" + name.decode("utf-8", "surrogateescape")
    if name == b"run-\xc3\xa9":
        out = os.fsencode(out).decode("ascii", "surrogateescape")
    one_line(lambda: absolute_paths(TrainConfig(out=out)), "out:", *needles, error=ConfigError)


def test_a_unicode_name_is_kept_and_reads_back(tmp_path):
    out = str(tmp_path / "méthyl 甲基")
    saved = dumps_toml(to_dict(absolute_paths(TrainConfig(out=out))))
    assert tomllib.loads(saved)["out"] == out
