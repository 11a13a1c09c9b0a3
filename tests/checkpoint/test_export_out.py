"""`lcft export` into an --out that holds a complete export: this very export (same source content, --dtype and lcft
version, as its lcft.json records) is "already exported" and another one is refused in one line, both decided before
anything is built (the writer never runs, nothing is written); what identifies a source's content."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import lcft.checkpoint.export as export
import lcft.checkpoint.export_out as export_out
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.checkpoint.reader import load
from lcft.checkpoint.save import write_checksums
from lcft.cli.app import app
from lcft.model import Llama
from lcft.model.weight_files import stored_dtype
from tests.cli.test_errors_without_torch import ROOT, RUN
from tests.one_line import cli_fails, one_line
from tests.train.conftest import init_dir, small_model_config  # noqa: F401  (fixture, by name)


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (hidden ones too) with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


@pytest.fixture
def writes(monkeypatch) -> list[Path]:
    """The folders the export's writer (`_write`, which builds the whole model folder) was called to fill."""
    calls, real = [], export._write

    def spy(source, build, *args, **kwargs):
        calls.append(build)
        return real(source, build, *args, **kwargs)

    monkeypatch.setattr(export, "_write", spy)
    return calls


def _checksummed(src: Path, dst: Path) -> Path:
    """A copy of the model folder `src` with a checksums.json, as every checkpoint lcft saves has."""
    shutil.copytree(src, dst)
    write_checksums(dst)
    return dst


def _said(text: str) -> str:
    """`text` without its white space (the console wraps long paths anywhere)."""
    return "".join(text.split())


def _exported(source: Path, out: Path, *options: str) -> None:
    r = CliRunner().invoke(app, ["export", str(source), "--out", str(out), *options])
    assert r.exit_code == 0 and _said(r.output).startswith(_said(f"wrote {out} (from")), r.output


@pytest.mark.parametrize("other", ["--dtype", "checkpoint", "checksummed checkpoint"])
def test_another_export_into_a_complete_export_is_refused_before_anything_is_built(tmp_path, init_dir, writes,  # noqa: F811
                                                                                    other):
    """The export of another --dtype, or of another checkpoint (one whose checksums.json differs, or one without
    such a file), into a folder holding a complete export: refused in one line at once, the writer never called
    and nothing written (was: the whole new export built into --out/.export.tmp first, then refused)."""
    source, out = init_dir, tmp_path / "hf"
    if other == "checksummed checkpoint":
        source = _checksummed(init_dir, tmp_path / "a")
    _exported(source, out)
    before, options = _tree(out), []
    writes.clear()
    if other == "--dtype":
        options = ["--dtype", "bfloat16"]
    else:
        torch.manual_seed(1)
        other_dir = tmp_path / "b"
        save_pretrained(Llama(small_model_config()), other_dir)
        source = _checksummed(other_dir, tmp_path / "b2") if other == "checksummed checkpoint" else other_dir
    cli_fails(["export", str(source), "--out", str(out), *options], str(out), "(use --force to overwrite)")
    assert writes == [] and _tree(out) == before


@pytest.mark.parametrize("source_kind, options", [("plain", []), ("checksummed", []), ("plain", ["--dtype", "bfloat16"])])
def test_the_same_export_run_again_builds_nothing(tmp_path, init_dir, writes, source_kind, options):  # noqa: F811
    """The same export run again once complete: "already exported to" and exit 0, the writer never called and
    --out unchanged (was: the whole export built again, then compared file by file)."""
    source = _checksummed(init_dir, tmp_path / "ckpt") if source_kind == "checksummed" else init_dir
    out = tmp_path / "hf"
    _exported(source, out, *options)
    before = _tree(out)
    writes.clear()
    r = CliRunner().invoke(app, ["export", str(source), "--out", str(out), *options])
    assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {out} (from {source})"), r.output
    assert writes == [] and _tree(out) == before
    r = CliRunner().invoke(app, ["export", str(source), "--out", str(out), *options, "--force"])
    assert r.exit_code == 0 and _said(r.output).startswith(_said(f"wrote {out} (from")) and len(writes) == 1, r.output


def test_the_same_export_of_a_sharded_checkpoint_run_again_builds_nothing(tmp_path, ckpt, writes):
    """A sharded (DCP) checkpoint, identified by its checksums.json: its export run again is "already exported" at
    once; another --dtype is refused at once."""
    out = tmp_path / "hf"
    _exported(ckpt, out)
    before = _tree(out)
    writes.clear()
    r = CliRunner().invoke(app, ["export", str(ckpt), "--out", str(out)])
    assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {out} (from {ckpt})"), r.output
    cli_fails(["export", str(ckpt), "--out", str(out), "--dtype", "bfloat16"], "(use --force to overwrite)")
    assert writes == [] and _tree(out) == before


def test_a_complete_export_recording_no_origin_is_compared_once_built(tmp_path, init_dir, writes):  # noqa: F811
    """A complete export whose lcft.json records no origin (an earlier lcft's): not known to be this export until
    built, then its files compared byte for byte: the same export is "already exported" (nothing moved), another
    refused in one line, `--out` unchanged either way."""
    out = tmp_path / "hf"
    _exported(init_dir, out)
    meta = json.loads((out / "lcft.json").read_text())
    del meta["export"]
    (out / "lcft.json").write_text(json.dumps(meta))
    (out / "config.json").write_text((out / "config.json").read_text() + " ")  # another writer's bytes
    before = _tree(out)
    writes.clear()
    cli_fails(["export", str(init_dir), "--out", str(out)], f"{out} already exists and its config.json is not "
              "this export's (use --force")
    assert len(writes) == 1 and _tree(out) == before


@pytest.mark.parametrize("change", ["a file added", "a file removed", "a file cut short", "a bit flipped"])
def test_the_same_export_with_other_files_is_refused_before_anything_is_built(tmp_path, init_dir, writes,  # noqa: F811
                                                                            change):
    """A complete export of this very origin beside a file of the user's, or lacking one of its files (or one of
    another size, or of its size with a bit flipped in place: was "already exported"): refused in one line naming
    that file, at once and changing nothing (only what the export writes, all of it, is "already exported")."""
    out = tmp_path / "hf"
    _exported(init_dir, out)
    if change == "a file added":
        (out / "notes.txt").write_text("mine\n")
        needle = f"{out} already exists and its notes.txt is not this export's (use --force"
    elif change == "a file removed":
        (out / "tokenizer.json").unlink()
        needle = f"{out} holds this export, but its tokenizer.json is missing or changed since it was written (use"
    elif change == "a file cut short":
        (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:-1])
        needle = f"{out} holds this export, but its model.safetensors is missing or changed since it was written"
    else:
        weights = bytearray((out / "model.safetensors").read_bytes())
        weights[len(weights) // 2] ^= 1  # in a weight: the file still reads, as another model
        (out / "model.safetensors").write_bytes(weights)
        needle = f"{out} holds this export, but its model.safetensors is missing or changed since it was written"
    before = _tree(out)
    writes.clear()
    cli_fails(["export", str(init_dir), "--out", str(out)], needle)
    assert writes == [] and _tree(out) == before


def test_the_origin_stays_with_the_export(tmp_path, init_dir):  # noqa: F811
    """An export's lcft.json records its source's content and --dtype; lcft reads the export as any model folder,
    and a model folder saved from it (as train --init's checkpoints are) records no origin of its own."""
    out, again = tmp_path / "hf", tmp_path / "again"
    _exported(init_dir, out, "--dtype", "bfloat16")
    record = json.loads((out / "lcft.json").read_text())["export"]
    assert record["dtype"] == "bfloat16" and len(record["source_sha256"]) == 64
    assert record["files"] == {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                               for p in out.iterdir() if p.name != "lcft.json"}
    read = load(out)
    assert next(read.model.parameters()).dtype == torch.bfloat16
    save_pretrained(read.model, again, tokenizer=read.tokenizer)
    assert "export" not in json.loads((again / "lcft.json").read_text())


def _digest(folder: Path) -> str:
    return export_out.model_sha256(folder)


def _changed(src: Path, dst: Path, name: str) -> Path:
    """A copy of `src` with one byte of its file `name` changed (a JSON file: a space added, so it still reads)."""
    shutil.copytree(src, dst)
    data = bytearray((dst / name).read_bytes())
    if name.endswith(".json"):
        data += b" "
    else:
        data[len(data) // 2] ^= 1
    (dst / name).write_bytes(data)
    return dst


def test_a_sources_content_is_what_the_export_reads_of_it(tmp_path, init_dir, monkeypatch):  # noqa: F811
    """Copies of one model folder have one identity whatever sits beside the files an export reads (hidden files
    at its top, a README, a pytorch_model.bin beside its safetensors, a shard no index names, a dcp/ its lcft.json
    does not name: each was hashed, and made it another source), and only those files are hashed; a byte changed
    in one of them gives another. With a checksums.json, that file (verified against the files when the checkpoint
    is resolved) is the identity."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(init_dir, a)
    (a / "tokenizer.json").write_text("{}")
    (a / "special_tokens_map.json").write_text("{}")
    (a / "generation_config.json").write_text("{}")  # exported as it is: another one makes another export
    shutil.copytree(a, b)
    (b / ".lcft.lock").write_text("123 lcft export\n")
    (b / ".git").mkdir()
    (b / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (b / "README.md").write_text("a model\n")
    (b / "pytorch_model.bin").write_bytes(b"weights not read beside safetensors")
    (b / "model-00002-of-00002.safetensors").write_bytes(b"a shard no index names")
    (b / "dcp").mkdir()
    (b / "dcp" / "__0_0.distcp").write_bytes(b"shard")
    hashed, real = [], export_out.file_hash
    monkeypatch.setattr(export_out, "file_hash", lambda f: hashed.append(f.name) or real(f))
    assert _digest(a) == _digest(b)
    read = ["config.json", "lcft.json", "model.safetensors", "tokenizer.json", "special_tokens_map.json",
            "generation_config.json"]
    assert sorted(hashed) == sorted(2 * read)
    for name in read:
        assert _digest(_changed(a, tmp_path / f"a-{name}", name)) != _digest(a), name
    write_checksums(a)
    assert _digest(a) == hashlib.sha256((a / "checksums.json").read_bytes()).hexdigest()


def test_a_sharded_sources_content_is_its_shards(tmp_path, init_dir):  # noqa: F811
    """Weights in safetensors shards: the index and the shards it names are the content, another shard beside
    them is not. A DCP checkpoint (its lcft.json says so): its dcp/ shards and metadata are, its optimizer's param
    groups and a model.safetensors beside them are not."""
    torch.manual_seed(0)
    s = tmp_path / "s"
    save_pretrained(Llama(small_model_config()), s, max_shard_size=64 << 10)
    shards = sorted(p.name for p in s.glob("model-*.safetensors"))
    assert len(shards) > 1
    t = tmp_path / "t"
    shutil.copytree(s, t)
    (t / "model-00099-of-00099.safetensors").write_bytes(b"a shard no index names")
    assert _digest(s) == _digest(t)
    for name in (shards[-1], "model.safetensors.index.json"):
        assert _digest(_changed(s, tmp_path / f"s-{name}", name)) != _digest(s), name
    d = tmp_path / "d"
    shutil.copytree(init_dir, d)
    (d / "lcft.json").write_text(json.dumps({**json.loads((d / "lcft.json").read_text()), "weights": "dcp"}))
    (d / "dcp").mkdir()
    for name, data in ((".metadata", b"index"), ("__0_0.distcp", b"shard"), ("param_groups.json", b"[]")):
        (d / "dcp" / name).write_bytes(data)
    e = _changed(d, tmp_path / "e", "dcp/param_groups.json")
    (e / "model.safetensors").write_bytes(b"weights not read beside dcp/")
    assert _digest(d) == _digest(e)
    for name in ("dcp/.metadata", "dcp/__0_0.distcp"):
        assert _digest(_changed(d, tmp_path / f"d-{name[4:]}", name)) != _digest(d), name


def test_files_beside_what_the_export_reads_leave_it_the_same_export(tmp_path, init_dir, writes):  # noqa: F811
    """An HF folder (no checksums.json) that gained a README and a pytorch_model.bin beside its safetensors after
    its export: the export run again is "already exported" at once (was: refused as another checkpoint)."""
    source, out = tmp_path / "model", tmp_path / "hf"
    shutil.copytree(init_dir, source)
    _exported(source, out)
    (source / "README.md").write_text("a model\n")
    (source / "pytorch_model.bin").write_bytes(b"weights not read beside safetensors")
    writes.clear()
    r = CliRunner().invoke(app, ["export", str(source), "--out", str(out)])
    assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {out} (from {source})"), r.output
    assert writes == []


@pytest.mark.parametrize("stored", ["float32", "bfloat16", pytest.param(
    "sharded", marks=[pytest.mark.distributed, pytest.mark.slow])])
def test_dtype_naming_the_stored_one_is_the_same_export(tmp_path, writes, stored, request):
    """--dtype naming the dtype the weights are stored in writes the files of the export without --dtype: either
    run after the other is "already exported" at once (was: refused as another --dtype, also for a sharded
    checkpoint, float32 in its DCP metadata, whose export without --dtype recorded no dtype); another dtype is
    refused."""
    torch.manual_seed(0)
    source, out, named = tmp_path / "model", tmp_path / "hf", tmp_path / "named"
    if stored == "sharded":
        source, stored = request.getfixturevalue("ckpt"), "float32"
    else:
        save_pretrained(Llama(small_model_config()), source, dtype=getattr(torch, stored))
    _exported(source, out)
    _exported(source, named, "--dtype", stored)
    assert {k: v for k, v in _tree(out).items() if k != "lcft.json"} == \
        {k: v for k, v in _tree(named).items() if k != "lcft.json"}
    writes.clear()
    for folder, options in ((out, ["--dtype", stored]), (named, [])):
        r = CliRunner().invoke(app, ["export", str(source), "--out", str(folder), *options])
        assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {folder} (from {source})"), \
            r.output
    cli_fails(["export", str(source), "--out", str(out), "--dtype", "float16"], "already holds an export of another")
    assert writes == []


def test_weights_of_several_dtypes_are_the_export_of_the_one_holding_them(tmp_path, init_dir, writes):  # noqa: F811
    """Weights stored in two dtypes, float32 and bfloat16, are exported in float32, the one holding both
    (lcft.model.weight_files.common_dtype): --dtype float32 is the same export, told from the headers before
    anything is built; --dtype bfloat16 writes other bytes, refused as another export."""
    from safetensors.torch import load_file, save_file

    source, out = tmp_path / "model", tmp_path / "hf"
    shutil.copytree(init_dir, source)
    tensors = load_file(source / "model.safetensors")
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].to(torch.bfloat16)
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    assert stored_dtype([source / "model.safetensors"]) == "float32"
    _exported(source, out)
    writes.clear()
    r = CliRunner().invoke(app, ["export", str(source), "--out", str(out), "--dtype", "float32"])
    assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {out} (from {source})"), r.output
    cli_fails(["export", str(source), "--out", str(out), "--dtype", "bfloat16"], "already holds an export of another")
    assert writes == []


def test_stored_dtype_is_read_from_the_headers_alone(tmp_path, init_dir):  # noqa: F811
    """The dtype the safetensors headers declare, as torch reads the tensors (no torch here); a header longer than
    safetensors allows is refused before it is read."""
    from safetensors.torch import load_file

    assert stored_dtype([init_dir / "model.safetensors"]) == \
        str(next(iter(load_file(init_dir / "model.safetensors").values())).dtype).removeprefix("torch.")
    bad = tmp_path / "model.safetensors"
    bad.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    one_line(lambda: stored_dtype([bad]), f"{bad}: cannot read weights (a header of {1 << 62} bytes declared")


def test_the_stored_dtype_is_told_without_torch(tmp_path, init_dir):  # noqa: F811
    """`lcft export CKPT --out X --dtype <as stored>` into X holding CKPT's export without --dtype: "already
    exported" before torch is imported (the weights' dtype is read from their headers)."""
    out = tmp_path / "hf"
    _exported(init_dir, out)
    r = subprocess.run([sys.executable, "-c", RUN, "export", str(init_dir), "--out", str(out), "--dtype", "float32"],
                       capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "400"},
                       timeout=300)
    lines = r.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == {"code": 0, "torch": False} and "already exported to" in r.stdout, r


def _with_header_entry(src: Path, dst: Path, change) -> Path:
    """A copy of the model folder `src` whose model.safetensors header has its first tensor's entry replaced by
    change(entry) (the tensor bytes as they were)."""
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    data = f.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    first = min(k for k in header if k != "__metadata__")
    header[first] = change(header[first])
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + size:])
    return dst


@pytest.mark.parametrize("change, said", [(lambda e: {**e, "dtype": ["F32"]}, "declares dtype ['F32']"),
                                          (lambda e: {**e, "dtype": {"F32": 1}}, "declares dtype {'F32': 1}"),
                                          (lambda e: [e], "is [{")])
def test_a_header_entry_naming_no_dtype_is_one_line(tmp_path, init_dir, change, said):  # noqa: F811
    """A safetensors header whose tensor entry is no object, or declares its dtype as a list or an object, is one
    line naming the file and tensor, re-exported into an earlier export (the dtype is read from the header before
    safetensors has looked at it: was a traceback, unhashable type: 'list') and to a new --out alike."""
    source = _with_header_entry(init_dir, tmp_path / "model", change)
    out = tmp_path / "hf"
    _exported(init_dir, out)
    for folder in (out, tmp_path / "new"):
        cli_fails(["export", str(source), "--out", str(folder)],
                  f"{source / 'model.safetensors'}: cannot read weights", "'lm_head.weight'", said)
