"""What a run's fingerprint holds of its inputs (lcft.train.run_dir.same_run): --data and --init compared by content,
so a node's own copy at another path is the same run and a copy of other windows or another model is not."""

from __future__ import annotations

import json
import shutil

from lcft.train import TrainConfig
from lcft.train.run_dir import same_run


def test_a_copy_of_the_inputs_elsewhere_is_the_same_run_and_other_windows_are_not(tmp_path, data_dir, init_dir):
    base = dict(out=str(tmp_path / "run"), seq_len=512)
    node0 = same_run(TrainConfig(data=str(data_dir), init=str(init_dir), **base))
    data, init = shutil.copytree(data_dir, tmp_path / "data"), shutil.copytree(init_dir, tmp_path / "init")
    assert same_run(TrainConfig(data=str(data), init=str(init), **base)) == node0
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["files"]["train.bin"]["sha256"] = "0" * 64  # windows prepared otherwise
    (data / "manifest.json").write_text(json.dumps(manifest))
    (init / "config.json").write_text((init / "config.json").read_text() + " ")  # another model's files
    other = same_run(TrainConfig(data=str(data), init=str(init), **base))
    assert {k for k in node0 if other[k] != node0[k]} == {"data", "init"}
    assert same_run(TrainConfig(data=str(tmp_path / "none"), **base))["data"] == "unreadable"
