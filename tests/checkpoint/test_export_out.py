"""`lcft export` into an --out that holds a complete export: this very export (same source content, --dtype and lcft
version, as its lcft.json records) is "already exported" and another one is refused in one line, both decided before
anything is built (the writer never runs, nothing is written); what identifies a source's content."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import lcft.checkpoint.export as export
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.checkpoint.reader import load
from lcft.checkpoint.save import write_checksums
from lcft.cli.app import app
from lcft.model import Llama
from tests.one_line import cli_fails
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


@pytest.mark.parametrize("change", ["a file added", "a file removed", "a file cut short"])
def test_the_same_export_with_other_files_is_refused_before_anything_is_built(tmp_path, init_dir, writes,  # noqa: F811
                                                                            change):
    """A complete export of this very origin beside a file of the user's, or lacking one of its files (or one of
    another size): refused in one line naming that file, at once and changing nothing (only what the export
    writes, all of it, is "already exported")."""
    out = tmp_path / "hf"
    _exported(init_dir, out)
    if change == "a file added":
        (out / "notes.txt").write_text("mine\n")
        needle = f"{out} already exists and its notes.txt is not this export's (use --force"
    elif change == "a file removed":
        (out / "tokenizer.json").unlink()
        needle = f"{out} holds this export, but its tokenizer.json is missing or of another size (use --force"
    else:
        (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:-1])
        needle = f"{out} holds this export, but its model.safetensors is missing or of another size (use --force"
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
    assert record["files"] == {p.name: p.stat().st_size for p in out.iterdir() if p.name != "lcft.json"}
    read = load(out)
    assert next(read.model.parameters()).dtype == torch.bfloat16
    save_pretrained(read.model, again, tokenizer=read.tokenizer)
    assert "export" not in json.loads((again / "lcft.json").read_text())


def _digest(folder: Path) -> str:
    from lcft.checkpoint.export_out import model_sha256

    return model_sha256(folder)


def test_a_sources_content_is_what_identifies_it(tmp_path, init_dir):  # noqa: F811
    """Copies of one model folder have one identity, whatever hidden files sit at its top; a byte changed in any
    file (one in a subfolder, as a sharded checkpoint's dcp/ holds, too) gives another. With a checksums.json,
    that file (verified against the files when the checkpoint is resolved) is the identity."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(init_dir, a)
    (a / "dcp").mkdir()
    (a / "dcp" / "__0_0.distcp").write_bytes(b"shard")
    shutil.copytree(a, b)
    (b / ".lcft.lock").write_text("123 lcft export\n")
    (b / ".git").mkdir()
    (b / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert _digest(a) == _digest(b)
    (b / "dcp" / "__0_0.distcp").write_bytes(b"sharD")
    assert _digest(a) != _digest(b)
    weights = bytearray((a / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (b / "model.safetensors").write_bytes(weights)
    (b / "dcp" / "__0_0.distcp").write_bytes(b"shard")
    assert _digest(a) != _digest(b)
    write_checksums(a)
    assert _digest(a) == hashlib.sha256((a / "checksums.json").read_bytes()).hexdigest()
