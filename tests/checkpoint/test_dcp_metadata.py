"""Sharded (DCP) checkpoints handed to lcft run no code: a payload planted in `dcp/.metadata` (checksums
re-hashed) or a pickled entry planted for an optimizer tensor is refused with one line naming it, on export,
eval, train --init and train --resume, and the marker file the payload would write never appears; a plain HF
folder with a stray `dcp/.metadata` is read as the HF folder it is. The oracle: torch's own reader runs both.
Damaged chunks, weights of two dtypes and a config.json that is not the metadata's model (16 layers x 1024
experts, other layers: refused before any model is built) are one line too, and so is an item of a shard file
whose torch.save zip holds a deflated record (refused before it is inflated)."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import pickle
import shutil
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex
from typer.testing import CliRunner

from lcft.checkpoint.model_files import is_sharded_checkpoint
from lcft.checkpoint.save import write_checksums
from lcft.cli.app import app
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.train import TrainConfig, train
from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture, by name)

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


def _damage_chunks(ckpt: Path, damage: str) -> None:
    """Rewrite the metadata of the model's lm_head (two chunks, one a rank) as a damaged or hostile file would
    have it; the checksums re-hashed."""
    d = ckpt / "dcp"
    md = dcp.FileSystemReader(str(d)).read_metadata()
    key = "model.lm_head.weight"
    meta, storage = md.state_dict_metadata[key], md.storage_data
    first, second = meta.chunks
    at = {i: MetadataIndex(key, c.offsets) for i, c in enumerate(meta.chunks)}
    if damage == "a chunk dropped":  # its rows were never read: memory as it was, read as weights
        meta.chunks = [first]
        del storage[at[1]]
    elif damage == "a chunk read twice":  # the rows of the second read again, the first's never
        meta.chunks = [second, dataclasses.replace(second)]
    elif damage == "a chunk outside":
        second.offsets = torch.Size([100, 0])
        storage[MetadataIndex(key, second.offsets)] = storage.pop(at[1])
    elif damage == "stored data shorter than the chunk":
        storage[at[0]] = dataclasses.replace(storage[at[0]], length=16)
    elif damage == "stored data past the file's end":
        info = storage[at[0]]
        storage[at[0]] = dataclasses.replace(info, offset=(d / info.relative_path).stat().st_size)
    md.storage_meta = dataclasses.replace(md.storage_meta, checkpoint_id=None)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    write_checksums(ckpt)


@pytest.mark.parametrize("entry", ["export", "eval"])
@pytest.mark.parametrize("damage, says", [
    ("a chunk dropped", ("'model.lm_head.weight'", "do not cover its size")),
    ("a chunk read twice", ("'model.lm_head.weight'", "do not cover its size")),
    ("a chunk outside", ("'model.lm_head.weight'", "lies outside its size")),
    ("stored data shorter than the chunk", ("'model.lm_head.weight'", "has stored data of 16 bytes")),
    ("stored data past the file's end", ("unreadable checkpoint", "the file was cut short"))])
def test_chunks_that_do_not_cover_a_tensor_once_are_refused(ckpt, sharded_run, tmp_path, data_dir, entry, damage,
                                                            says):
    """Export wrote, and eval read, whatever memory held for rows no chunk covered (exit 0, a loss that changed
    from run to run); stored lengths were never compared with the chunks' sizes or the files' bytes. Now every
    tensor's chunks must cover it once, from stored data that is there: one line naming the tensor or file."""
    _damage_chunks(ckpt, damage)
    _refused(_entry_points(ckpt, sharded_run, tmp_path, data_dir)[entry], *says)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("entry", ["export", "eval"])
def test_sizes_past_the_stored_bytes_are_refused_before_anything_is_allocated(ckpt, sharded_run, tmp_path, data_dir,
                                                                               entry):
    """config.json and the metadata agree on a model of hidden 65536 (about 140 GB), every size within its own
    limit, while the shard files hold the small model's 10 MB: export wrote 52 GB of uninitialised memory and
    eval died allocating 137 GB. The stored bytes bound the sizes before anything is allocated for them."""
    from lcft.checkpoint.dcp import model_on_meta
    from lcft.files import read_json

    config = read_json(ckpt / "config.json")
    config.update(hidden_size=1 << 16, intermediate_size=1 << 19, head_dim=2048)
    (ckpt / "config.json").write_text(json.dumps(config))
    shapes = {f"model.{n}": p.shape for n, p in model_on_meta(ckpt, None).named_parameters()}
    d = ckpt / "dcp"
    md = dcp.FileSystemReader(str(d)).read_metadata()
    for key, shape in shapes.items():  # the same chunks, stretched: split on dim 0 as before
        meta = md.state_dict_metadata[key]
        cut = [c.offsets[0] * shape[0] // meta.size[0] for c in meta.chunks] + [shape[0]]
        for c, lo, hi in zip(meta.chunks, cut[:-1], cut[1:], strict=True):
            old = MetadataIndex(key, c.offsets)
            c.offsets, c.sizes = torch.Size([lo, *[0] * (len(shape) - 1)]), torch.Size([hi - lo, *shape[1:]])
            md.storage_data[MetadataIndex(key, c.offsets)] = md.storage_data.pop(old)
        meta.size = shape
    md.storage_meta = dataclasses.replace(md.storage_meta, checkpoint_id=None)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    write_checksums(ckpt)
    _refused(_entry_points(ckpt, sharded_run, tmp_path, data_dir)[entry], "has stored data of")
    assert not (tmp_path / "hf").exists()


def test_a_weight_declared_as_bytes_is_refused(ckpt, tmp_path):
    """A model entry re-declared as bytes (BytesStorageMetadata, which an optimizer entry may be): export ended in
    an AttributeError traceback reading its dtype. One line naming it; nothing written."""
    d = ckpt / "dcp"
    md = dcp.FileSystemReader(str(d)).read_metadata()
    md.state_dict_metadata["model.embed_tokens.weight"] = BytesStorageMetadata()
    md.storage_meta = dataclasses.replace(md.storage_meta, checkpoint_id=None)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    write_checksums(ckpt)
    _refused(lambda: _cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]),
             "'model.embed_tokens.weight' as bytes, not a tensor")
    assert not (tmp_path / "hf").exists()


def test_weights_in_two_dtypes_are_refused(ckpt, tmp_path):
    """Export took the first tensor's dtype for the whole model: one tensor declared float16 made it write every
    weight as float16. lcft writes one dtype: two are one line."""
    d = ckpt / "dcp"
    md = dcp.FileSystemReader(str(d)).read_metadata()
    meta = md.state_dict_metadata["model.embed_tokens.weight"]
    meta.properties = dataclasses.replace(meta.properties, dtype=torch.float16)
    md.storage_meta = dataclasses.replace(md.storage_meta, checkpoint_id=None)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    write_checksums(ckpt)
    _refused(lambda: _cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]), "2 dtypes (float16, float32)")
    assert not (tmp_path / "hf").exists()


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


# --- config.json against the metadata ---------------------------------------------------------------------------

HOSTILE = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", num_hidden_layers=16,
               num_local_experts=1024, num_experts_per_tok=1)  # 16,384 MLPs: config.MAX_MLPS


def _config(ckpt: Path, **changes) -> None:
    """The checkpoint's config.json with `changes`, the checksums re-hashed (as a hostile folder has them)."""
    config = json.loads((ckpt / "config.json").read_text())
    config.update(changes)
    (ckpt / "config.json").write_text(json.dumps(config))
    write_checksums(ckpt)


@pytest.mark.parametrize("entry", ["export", "meta", "eval"])
def test_a_config_of_16k_experts_beside_small_shards_is_refused_before_a_model_is_built(
        ckpt, sharded_run, tmp_path, data_dir, entry, monkeypatch):
    """config.json says Mixtral, 16 layers x 1024 experts, beside the 2-layer run's shards: export and an fsdp
    --init/--resume (`load(materialize=False)`, "meta") built that model on the meta device (17 s for an export
    here, 157 s for a 2-rank --resume, which sharded it too) before the metadata was compared with it. Now its
    names and shapes are compared first, as a weight file's headers are: one line naming the first tensor
    config.json has not, and no model but the one-block template is built (any other fails the test at once)."""
    import lcft.model.llama as llama
    from lcft.checkpoint.reader import load

    _config(ckpt, **HOSTILE)
    built = llama.Llama.__init__

    def one_block_only(self, cfg):
        assert cfg.num_hidden_layers == 1, f"a model of {cfg.num_hidden_layers} blocks was built"
        built(self, cfg)

    monkeypatch.setattr(llama.Llama, "__init__", one_block_only)
    points = {**_entry_points(ckpt, sharded_run, tmp_path, data_dir), "meta": lambda: load(ckpt, materialize=False)}
    _refused(points[entry], f"{ckpt / 'dcp' / '.metadata'}: unexpected weight 'model.layers.0.mlp.gate_proj.weight'",
             "not a mixtral checkpoint")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("layers, says", [(1, "unexpected weight 'model.layers.1."),
                                          (3, "9 weight(s) missing: model.layers.2.attn.k_proj.weight, ")])
def test_a_config_of_other_layers_than_the_shards_is_refused(ckpt, tmp_path, layers, says):
    """config.json of 1 layer beside the shards of 2: export wrote the 1-layer model, the second layer's weights
    dropped (exit 0). Fewer or more, it is one line naming the first tensor that differs, as for weight files."""
    md = dcp.FileSystemReader(str(ckpt / "dcp")).read_metadata()  # the oracle: torch's reader
    assert {k.split(".")[2] for k in md.state_dict_metadata if k.startswith("model.layers.")} == {"0", "1"}
    _config(ckpt, num_hidden_layers=layers)
    _refused(lambda: _cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]), f"{ckpt / 'dcp' / '.metadata'}: ",
             says)
    assert not (tmp_path / "hf").exists()


def test_export_estimate_of_sharded_weights_scales_from_their_metadata(ckpt):
    """config.json says bfloat16 while the shards hold float32 (as torch's reader says): the estimate scales from
    the metadata's dtype, the one the export writes, not config.json's."""
    from lcft.checkpoint.export import export_bytes
    from lcft.checkpoint.model_files import sharded_weight_files

    md = dcp.FileSystemReader(str(ckpt / "dcp")).read_metadata()
    assert {v.properties.dtype for k, v in md.state_dict_metadata.items() if k.startswith("model.")} == {torch.float32}
    weights = sum(f.stat().st_size for f in sharded_weight_files(ckpt)) // 3  # weights and AdamW's two moments
    _config(ckpt, dtype="bfloat16")
    assert export_bytes(ckpt, torch.bfloat16) == weights // 2
    assert export_bytes(ckpt, torch.float32) == export_bytes(ckpt, None) == weights


@functools.cache
def _with_deflated_pickle(stored: bytes) -> bytes:
    """The torch.save zip `stored` with its data.pkl deflated and followed by 512 MiB of zeros (deflated once per
    item: seconds of zlib, and every test's checkpoint holds the same item)."""
    item, out = zipfile.ZipFile(io.BytesIO(stored)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for record in item.infolist():
            if not record.filename.endswith("/data.pkl"):
                z.writestr(record.filename, item.read(record))
                continue
            deflated = zipfile.ZipInfo(record.filename)
            deflated.compress_type = zipfile.ZIP_DEFLATED
            with z.open(deflated, "w", force_zip64=True) as w:
                w.write(item.read(record))
                for _ in range(512):
                    w.write(bytes(1 << 20))
    return out.getvalue()


def _deflate_an_item(ckpt: Path) -> Path:
    """The model's first stored item (torch.save's zip, one an item) rewritten into a shard file of its own with
    its data.pkl deflated and followed by 512 MiB of zeros (the pickle ends before them: torch.load reads the
    tensor as it was); the metadata points there and the checksums are re-hashed. The file holds ~0.5 MiB."""
    d = ckpt / "dcp"
    md = dcp.FileSystemReader(str(d)).read_metadata()
    index = next(i for i in md.storage_data if i.fqn.startswith("model."))
    info = md.storage_data[index]
    with open(d / info.relative_path, "rb") as fh:
        fh.seek(info.offset)
        bomb = _with_deflated_pickle(fh.read(info.length))
    shard = d / "__9_0.distcp"
    shard.write_bytes(bomb)
    md.storage_data[index] = _StorageInfo(shard.name, 0, len(bomb))
    md.storage_meta = dataclasses.replace(md.storage_meta, checkpoint_id=None)
    (d / ".metadata").write_bytes(pickle.dumps(md))
    write_checksums(ckpt)
    assert shard.stat().st_size < 1 << 20
    return shard


INFLATE = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from lcft.errors import LcftError
    from tests.checkpoint.test_dcp_metadata import _entry_points
    entry, ckpt, cfg, tmp, data = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
    call = _entry_points(ckpt, (None, cfg), Path(tmp), Path(data))[entry]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        call()
    except LcftError as e:
        print("LcftError", e)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, "MiB")
""")


@pytest.mark.parametrize("entry", ["export", "eval", "resume"])
def test_a_deflated_record_in_a_shard_item_is_refused_before_it_is_inflated(preloaded, ckpt, sharded_run,  # noqa: F811
                                                                             tmp_path, data_dir, entry):
    """DCP torch.loads each item of a shard file, a torch.save zip, whole: a data.pkl deflated inside one (512 MiB
    of zeros in a file of ~0.5 MiB) was inflated whole, and the read went on with the tensor as saved. Each item's
    records must be stored within its bytes, as a trainer state's: one line naming the file, before any is read.
    (The read runs forked from the module's preloaded process: lcft imported once, the read's peak its own.)"""
    shard = _deflate_an_item(ckpt)
    proc = preloaded.run(["-c", INFLATE, entry, str(ckpt), json.dumps(sharded_run[1]), str(tmp_path), str(data_dir)])
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert int(lines[-1].split()[0]) < 256, lines  # MiB above the peak before reading
    assert lines[0].startswith("LcftError") and str(shard) in lines[0] and "is compressed" in lines[0], lines
    assert "data.pkl" in lines[0] and not (tmp_path / "hf").exists()


def test_a_metadata_file_grown_past_its_bound_after_its_size_was_read_is_refused(tmp_path, monkeypatch):
    """Its size is looked at, then it is read: one that grew in between (or that reports a size it does not hold)
    was read whole, whatever it had grown to; now no more than the bound is read, then it is refused."""
    import os

    from lcft.checkpoint import dcp_metadata

    path = tmp_path / ".metadata"
    with open(path, "wb") as f:
        f.truncate(dcp_metadata.MAX_METADATA_BYTES + 1)  # a sparse file: no disk
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 0, *real(fd)[7:])))  # "0 bytes"
    with pytest.raises(LcftError, match=rf"\.metadata: refused: larger than {dcp_metadata.MAX_METADATA_BYTES >> 20} MiB"):
        dcp_metadata.read_metadata_file(path)
