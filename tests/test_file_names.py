"""The names of the files lcft writes into its folders are spelled once, as constants that every reader and writer
imports: a copy spelled beside the constant would go on naming the old file if the name changed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

LCFT = Path(__file__).resolve().parents[1] / "lcft"

# Each name, as a Python string of its own, and the modules that may spell it (its constant's home; two homes are two
# different files of that name: prepare's own state.json and .partial beside a checkpoint's and eval's).
HOMES = {
    "summary.json": {"train/run_dir.py"},
    "metrics.jsonl": {"train/run_dir.py"},
    "config.toml": {"checkpoint/layout.py"},
    # hub.py: the files to download from a Hub repository (it sits below lcft.checkpoint.layout, which imports it)
    "config.json": {"checkpoint/layout.py", "hub.py"},
    "lcft.json": {"checkpoint/layout.py"},
    "checksums.json": {"checkpoint/layout.py"},
    "trainer_state": {"checkpoint/layout.py"},
    "state.json": {"checkpoint/layout.py", "genomics/prepare_state.py"},
    "manifest.json": {"genomics/shards.py"},
    "tokenizer.json": {"genomics/seq_tokenizer.py", "hub.py"},
    "eval.json": {"evaluate/report.py"},
    "loss_by_position.png": {"evaluate/report.py"},
    "loss_by_position.csv": {"evaluate/report.py"},
    ".partial": {"evaluate/store.py", "genomics/prepare_folder.py"},
}


def _spelled(pattern: str) -> dict[str, int]:
    """{module: how many times} for every module of lcft/ where `pattern` matches."""
    found: dict[str, int] = {}
    for path in sorted(LCFT.rglob("*.py")):
        if n := len(re.findall(pattern, path.read_text())):
            found[path.relative_to(LCFT).as_posix()] = n
    return found


@pytest.mark.parametrize("name", sorted(HOMES))
def test_a_file_name_is_spelled_once_in_its_home(name):
    found = _spelled(rf"""(?<![\w.])(["']){re.escape(name)}\1""")
    assert found == dict.fromkeys(HOMES[name], 1)


def test_the_checkpoints_folder_is_joined_through_its_constant():
    """("checkpoints" is also a report's key: only a path join spelling it counts.)"""
    assert _spelled(r"""/\s*(["'])checkpoints\1""") == {}
