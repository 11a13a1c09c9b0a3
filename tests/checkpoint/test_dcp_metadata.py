"""Sharded (DCP) checkpoints handed to lcft run no code: a payload planted in `dcp/.metadata` (checksums
re-hashed) or a pickled entry planted for an optimizer tensor is refused with one line naming it, on export,
eval, train --init and train --resume, and the marker file the payload would write never appears; a plain HF
folder with a stray `dcp/.metadata` is read as the HF folder it is. The oracle: torch's own reader runs both."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex
from typer.testing import CliRunner

from lcft.checkpoint.dcp import is_sharded_checkpoint
from lcft.checkpoint.save import write_checksums
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.train import TrainConfig, train

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # one 2-rank fsdp run of 2 steps, then 1-process reads


class Payload:
    """Unpickling this runs code: it writes a marker file (what an attacker's payload would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _plant_in_metadata(folder: Path, marker: Path) -> Path:
    """The real metadata with a payload attached, written as torch writes it (plain pickle)."""
    path = folder / "dcp" / ".metadata"
    md = dcp.FileSystemReader(str(folder / "dcp")).read_metadata()
    md.planner_data = {"x": Payload(marker)}
    path.write_bytes(pickle.dumps(md))
    dcp.FileSystemReader(str(folder / "dcp")).read_metadata()  # the oracle: torch's reader runs it
    assert marker.read_text() == "ran"
    marker.unlink()
    return path


def _plant_optimizer_entry(folder: Path, marker: Path) -> str:
    """An optimizer tensor re-declared as a pickled entry (torch.load(weights_only=False) in torch's planner),
    its bytes in a new shard file; the metadata holds only DCP's own classes."""
    d = folder / "dcp"
    md = dcp.FileSystemReader(str(d)).read_metadata()
    key = next(k for k in md.state_dict_metadata if k.startswith("optim.state.") and k.endswith(".step"))
    blob = d / "__9_0.distcp"
    torch.save(Payload(marker), blob)
    md.state_dict_metadata[key] = BytesStorageMetadata()
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != key}
    md.storage_data[MetadataIndex(key)] = _StorageInfo(blob.name, 0, blob.stat().st_size)
    md.storage_meta = dataclasses.replace(md.storage_meta, checkpoint_id=None)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    return key


def _refused(call, *needles: str) -> None:
    with pytest.raises(LcftError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg and all(n in msg for n in needles), msg


def _entry_points(ckpt: Path, sharded_run, tmp_path: Path, data_dir: Path) -> dict:
    run, cfg = sharded_run
    return {
        "export": lambda: _cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]),
        "eval": lambda: evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt),), max_windows=1,
                                            out=str(tmp_path / "eval"))),
        "init": lambda: train(TrainConfig(**{**cfg, "init": str(ckpt), "steps": 1, "out": str(tmp_path / "i")})),
        "resume": lambda: train(TrainConfig(**{**cfg, "resume": str(ckpt), "steps": 3,
                                               "out": str(ckpt.parent.parent)})),
    }


def _cli(args: list[str]) -> None:
    res = CliRunner().invoke(app, args)
    if res.exit_code != 0:
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and res.exit_code == 1, res.output
        raise LcftError(lines[0].removeprefix("error: "))


@pytest.mark.parametrize("entry", ["export", "eval", "init", "resume"])
def test_payload_in_dcp_metadata_is_refused_and_not_run(ckpt, sharded_run, tmp_path, data_dir, entry):
    marker = tmp_path / "pwned"
    path = _plant_in_metadata(ckpt, marker)
    write_checksums(ckpt)  # an attacker recomputes the checksums: the reader itself must refuse
    _refused(_entry_points(ckpt, sharded_run, tmp_path, data_dir)[entry], str(path), "refused")
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["export", "eval", "init", "resume"])
def test_pickled_optimizer_entry_is_refused_and_not_run(ckpt, sharded_run, tmp_path, data_dir, entry):
    marker = tmp_path / "pwned"
    key = _plant_optimizer_entry(ckpt, marker)
    write_checksums(ckpt)
    if entry == "resume":  # the optimizer state is read on resume only
        _refused(_entry_points(ckpt, sharded_run, tmp_path, data_dir)[entry], key, "refused")
    else:  # weights only: the planted entry is never read, the model loads
        _entry_points(ckpt, sharded_run, tmp_path, data_dir)[entry]()
    assert not marker.exists()
    oracle = {"optim": {"state": {key.split(".", 2)[2].rsplit(".", 1)[0]: {"step": torch.zeros(())}}}}
    dcp.load(oracle, checkpoint_id=str(ckpt / "dcp"), no_dist=True)  # the oracle: torch's planner runs it
    assert marker.read_text() == "ran"


def test_hf_folder_with_a_stray_dcp_metadata_is_read_as_hf(init_dir, tmp_path, data_dir):
    folder = tmp_path / "model"
    shutil.copytree(init_dir, folder)
    (folder / "dcp").mkdir()
    marker = tmp_path / "pwned"
    (folder / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    assert not is_sharded_checkpoint(folder)
    _cli(["export", str(folder), "--out", str(tmp_path / "hf")])
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(folder),), max_windows=1, out=str(tmp_path / "ev")))
    assert not marker.exists()
