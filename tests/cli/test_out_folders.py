"""Every --out is refused, in one line and before anything is written, when it is a folder lcft reads back as
something else (the --data windows, a run, a checkpoint, a model folder) or the folder holding --fasta."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.evaluate.conftest import data_dir, save_model  # noqa: F401 (fixture)
from tests.one_line import cli_fails


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def _kinds(tmp_path: Path) -> dict[str, Path]:
    """A model folder, a run folder with one checkpoint, and a folder holding a FASTA."""
    model = save_model(tmp_path / "model", seed=1)
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state").mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 16}))
    (tmp_path / "run" / "config.toml").write_text('steps = 1\n')
    (tmp_path / "w2").mkdir()
    (tmp_path / "w2" / "manifest.json").write_text("{}")  # another windows folder (what its kind is told by)
    (tmp_path / "genome").mkdir()
    (tmp_path / "genome" / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    return {"model": model, "run": tmp_path / "run", "ckpt": ckpt, "fasta": tmp_path / "genome" / "g.fa",
            "windows": tmp_path / "w2"}


@pytest.mark.parametrize("case", ["train-into-data", "train-into-model", "train-into-checkpoint",
                                  "eval-into-data", "eval-into-checkpoint", "export-into-run",
                                  "prepare-into-run", "prepare-into-fasta-folder", "export-into-windows",
                                  "train-into-other-windows"])
def test_out_of_another_kind_is_one_line_and_writes_nothing(case, data_dir, tmp_path):  # noqa: F811
    k = _kinds(tmp_path)
    data = str(data_dir)
    args, needle = {
        "train-into-data": (["train", "--data", data, "--out", data, "--steps", "1"], f"is --data {data}"),
        "train-into-model": (["train", "--data", data, "--out", str(k["model"])], "is a model folder"),
        "train-into-checkpoint": (["train", "--data", data, "--out", str(k["ckpt"])], "is a checkpoint"),
        "eval-into-data": (["eval", "--data", data, "-c", str(k["model"]), "--out", data], f"is --data {data}"),
        "eval-into-checkpoint": (["eval", "--data", data, "-c", str(k["model"]), "--out", str(k["ckpt"])],
                            "is a checkpoint"),
        "export-into-windows": (["export", str(k["model"]), "--out", data, "--force"],
                                "is a prepared windows folder"),
        "train-into-other-windows": (["train", "--data", data, "--out", str(k["windows"])],
                                     "is a prepared windows folder"),
        "export-into-run": (["export", str(k["model"]), "--out", str(k["run"]), "--force"],
                            "is a training run's folder"),
        "prepare-into-run": (["prepare", "windows", "--fasta", str(k["fasta"]), "--out", str(k["run"]),
                              "--length", "64", "--train", "chrA", "--eval", ""], "is a training run's folder"),
        "prepare-into-fasta-folder": (["prepare", "windows", "--fasta", str(k["fasta"]), "--out",
                                       str(k["fasta"].parent), "--length", "64", "--train", "chrA", "--eval", ""],
                                      f"holds --fasta {k['fasta']}"),
    }[case]
    before = {name: _listing(p) for name, p in (("data", data_dir), ("tmp", tmp_path))}
    cli_fails(args, needle, "choose another --out")
    assert {name: _listing(p) for name, p in (("data", data_dir), ("tmp", tmp_path))} == before

