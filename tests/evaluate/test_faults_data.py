"""Damaged prepared data: eval checks the split's checksums first (a flag skips it), and `prepare verify`
catches a manifest that disagrees with its own windows (the sizes train would then call corrupt)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.inputs import open_split
from lcft.genomics import verify_windows

runner = CliRunner()


@pytest.fixture
def data_copy(tmp_path, data_dir) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(data_dir, dst)
    return dst


def flip(path: Path, at: int = 1000, value: int = 0xEE) -> None:
    data = bytearray(path.read_bytes())
    data[at] = value  # 0xEE is no token of the char vocabulary: out of vocabulary
    path.write_bytes(bytes(data))


def test_eval_refuses_a_flipped_byte_before_evaluating(data_copy, ckpt_a, tmp_path):
    flip(data_copy / "eval.bin")
    out = tmp_path / "rep"
    r = runner.invoke(app, ["eval", "--data", str(data_copy), "--checkpoint", str(ckpt_a), "--out", str(out),
                            "--quiet"])
    assert r.exit_code == 1
    text = " ".join(r.output.split())
    assert "eval.bin is corrupt" in text and "Traceback" not in r.output and "IndexError" not in r.output
    assert not out.exists()


def test_verification_can_be_skipped_and_covers_only_the_split(data_copy):
    flip(data_copy / "eval.bin")
    cfg = dict(data=str(data_copy), checkpoints=("x",))
    with pytest.raises(LcftError, match="eval.bin is corrupt"):
        open_split(EvalConfig(**cfg))
    assert len(open_split(EvalConfig(**cfg, verify_data=False))) > 0  # --no-verify-data: not read through
    flip(data_copy / "train.bin")
    with pytest.raises(LcftError, match="train.bin is corrupt"):
        verify_windows(data_copy, ("train",))
    assert "--no-verify-data" in " ".join(runner.invoke(app, ["eval", "--help"]).output.split())


@pytest.mark.parametrize("edit", ["drop_record", "length"])
def test_prepare_verify_checks_the_manifest_against_its_windows(data_copy, edit):
    """File sizes and sha256 still match what the manifest lists, but its windows need other sizes."""
    m = json.loads((data_copy / "manifest.json").read_text())
    if edit == "drop_record":
        m["records"] = [r for r in m["records"] if r["split"] == "train"][1:] + \
            [r for r in m["records"] if r["split"] != "train"]
    else:
        m["length"] = m["length"] * 2
    (data_copy / "manifest.json").write_text(json.dumps(m))
    r = runner.invoke(app, ["prepare", "verify", str(data_copy)])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "manifest.json is inconsistent" in text and "train.bin" in text and "Traceback" not in r.output
