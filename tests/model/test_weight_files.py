"""Weight files in a folder whose name is not valid UTF-8 (a byte such as 0xff on Linux): read as any other."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.checkpoint.weights import check_weights_readable
from lcft.cli.app import app
from lcft.model.weight_files import weight_files
from tests.checkpoint.test_hf_folder import same_weights, small

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a file name of any bytes: Linux's file systems")


@pytest.mark.parametrize("shards", [False, True])
def test_a_model_folder_whose_name_is_not_utf8_is_read_and_exported(tmp_path, shards):
    """safetensors refuses such a path ('Path ... is not valid UTF-8', which `lcft export` printed as its one
    line): the folder's model (one file or shards) reads back as saved, the readable check passes, and its export
    is the model saved."""
    model = small(seed=3)
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/model-\xff"))
    save_pretrained(model, folder, **({"max_shard_size": 4096} if shards else {}))
    assert (len(weight_files(folder)) > 1) == shards
    assert same_weights(from_pretrained(folder), model)
    check_weights_readable(folder)
    r = CliRunner().invoke(app, ["export", str(folder), "--out", str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    assert same_weights(from_pretrained(tmp_path / "hf"), model)
