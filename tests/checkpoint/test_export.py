"""`lcft export`: its size estimate (what it names on a full disk) scales from the dtype the weights' headers
declare, whatever config.json says; an export killed half-way leaves nothing that a rerun does not remove; a
published model's use_cache is written back, and its generation_config.json carried byte for byte."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from typer.testing import CliRunner

from lcft.checkpoint.export import export_bytes
from lcft.checkpoint.hf_folder import save_pretrained
from lcft.cli.app import app
from lcft.genomics.hf_tokenizer import save_hf_tokenizer
from lcft.genomics.model_tokenizer import load_tokenizer
from lcft.genomics.seq_tokenizer import SeqTokenizer
from lcft.genomics.tokenizer import encode as char_encode
from lcft.genomics.tokenizer import tokenizer_spec
from lcft.model import Llama, LlamaConfig
from lcft.model.hf import config_from_hf
from tests.one_line import cli_fails, gcsfuse, refused


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_export_estimate_scales_from_the_weights_headers_not_config_json(tmp_path, key):
    """config.json says float32 ("dtype" as lcft and transformers 5 write it, "torch_dtype" as earlier
    transformers did) while the weights are stored in bfloat16: the estimate scales from the headers' dtype (the
    one the export's record names), so --dtype float32 doubles it and bfloat16 keeps it."""
    folder = tmp_path / "bf16"
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2)
    save_pretrained(Llama(cfg), folder, dtype=torch.bfloat16)
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype")
    config[key] = "float32"
    (folder / "config.json").write_text(json.dumps(config))
    assert {t.dtype for t in load_file(folder / "model.safetensors").values()} == {torch.bfloat16}
    stored = (folder / "model.safetensors").stat().st_size
    assert export_bytes(folder, torch.float32) == stored * 2
    assert export_bytes(folder, torch.bfloat16) == stored
    assert export_bytes(folder, None) == stored


# `lcft export` in a fresh process, SIGKILLed half-way through writing the weights: the writer's hidden temp file
# beside its target holds half of them, as safetensors' own does until it renames it over the target.
KILL_EXPORT = """
import os, signal, sys, tempfile
import safetensors.torch
import lcft.checkpoint.hf_folder as hf_folder
from lcft.cli.app import app

def torn(tensors, filename, metadata=None):
    data = safetensors.torch.save(tensors, metadata)
    fd, _ = tempfile.mkstemp(prefix=".tmp", dir=os.path.dirname(filename))
    os.write(fd, data[: len(data) // 2])
    os.fsync(fd)
    os.kill(os.getpid(), signal.SIGKILL)

hf_folder.save_file = torn
app(sys.argv[1:])
"""


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("before", ["new", "empty", "earlier export"])
def test_killed_export_leaves_nothing_a_rerun_keeps(tmp_path, init_dir, before):
    """A new --out appears complete or not at all; an existing one keeps its files; the rerun (--force only over
    an earlier export) gives the model, and no hidden leftover of the killed export stays anywhere."""
    parent = tmp_path / "exports"
    parent.mkdir()
    out = parent / "hf"
    force = ["--force"] if before == "earlier export" else []
    if before == "empty":
        out.mkdir()
    if force:
        torch.manual_seed(1)
        save_pretrained(Llama(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2)), out)
    kept = {p.name: p.read_bytes() for p in out.iterdir()} if out.is_dir() else None
    proc = subprocess.run([sys.executable, "-c", KILL_EXPORT, "export", str(init_dir), "--out", str(out), *force],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    if kept is None:
        assert not out.exists()
    else:
        assert {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")} == kept

    r = CliRunner().invoke(app, ["export", str(init_dir), "--out", str(out), *force])
    assert r.exit_code == 0, r.output
    want = _weights(init_dir)
    got = _weights(out)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert os.listdir(parent) == ["hf"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_export_where_the_file_system_will_not_rename_a_folder_is_one_line(tmp_path, init_dir, monkeypatch):
    """A new --out on gcsfuse over a flat bucket (EMFILE renaming a folder of files past --rename-dir-limit, 0 by
    default): one line naming the file system's folder and the remedy (it said only 'Too many open files'), and
    neither --out nor the hidden work folder stays."""
    gcsfuse(monkeypatch, "replace")
    out = tmp_path / "hf"
    assert cli_fails(["export", str(init_dir), "--out", str(out)]) == \
        f"error: cannot export to {out}: {refused(tmp_path, errno.EMFILE)}"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_export_onto_a_file_says_so(tmp_path, init_dir, force):
    target = tmp_path / "notes.txt"
    target.write_text("keep\n")
    r = CliRunner().invoke(app, ["export", str(init_dir), "--out", str(target), *force])
    assert r.exit_code == 1 and " ".join(r.output.split()) == f"error: --out {target} is a file, not a folder"
    assert target.read_text() == "keep\n" and sorted(os.listdir(tmp_path)) == ["notes.txt"]


@pytest.mark.parametrize("inside", ["", "sub"])
def test_export_into_its_own_checkpoint_is_refused(tmp_path, init_dir, inside):
    """`--out` the checkpoint itself (or a folder in it) with --force replaced its files: its checksums no
    longer held and a resume moved it to superseded/."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(init_dir, ckpt)
    before = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    out = ckpt / inside if inside else ckpt
    r = CliRunner().invoke(app, ["export", str(ckpt), "--out", str(out), "--force", "--dtype", "bfloat16"])
    assert r.exit_code == 1, r.output
    assert " ".join(r.output.split()) == (f"error: --out {out} is the checkpoint {ckpt}, or inside it: "
                                          "write the export to another folder")
    assert {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("use_cache", [False, True, "absent"])
def test_export_keeps_the_published_use_cache(tmp_path, use_cache):
    """METAGENE-1's config.json as published (use_cache false), scaled to one small layer: the exported
    config.json holds the value transformers' AutoConfig reads from the source folder (its default, true, where
    the key is absent), and AutoConfig reads that value back from the export."""
    transformers = pytest.importorskip("transformers")
    from tests.model.test_hf_config import published

    d = published("metagene-1")
    assert d["use_cache"] is False
    d.update(num_hidden_layers=1, hidden_size=64, intermediate_size=96, num_attention_heads=2,
             num_key_value_heads=2, head_dim=32)
    if use_cache == "absent":
        del d["use_cache"]
    else:
        d["use_cache"] = use_cache
    src, out = tmp_path / "src", tmp_path / "out"
    torch.manual_seed(0)
    save_pretrained(Llama(config_from_hf(d)), src)  # weights and lcft.json; then config.json as published
    (src / "config.json").write_text(json.dumps(d))
    want = transformers.AutoConfig.from_pretrained(str(src)).use_cache
    assert want is (use_cache is not False)
    r = CliRunner().invoke(app, ["export", str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "config.json").read_text())["use_cache"] is want
    assert transformers.AutoConfig.from_pretrained(str(out)).use_cache is want


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json",
                                  "model-00001-of-00002.safetensors", "generation_config.json"])
def test_export_over_a_folder_named_like_a_model_file_changes_nothing(tmp_path, init_dir, name):
    """--force over an earlier export where a folder stands under a name the export writes (or removes, an
    earlier save's weight shard or generation_config.json, where the source has none): refused, naming it, before anything in --out is replaced or removed."""
    out = tmp_path / "hf"
    assert CliRunner().invoke(app, ["export", str(init_dir), "--out", str(out)]).exit_code == 0
    (out / name).unlink(missing_ok=True)
    (out / name).mkdir()
    (out / name / "notes.txt").write_text("keep\n")
    before = _tree(out)
    cli_fails(["export", str(init_dir), "--out", str(out), "--force"], str(out / name), "is a folder")
    assert _tree(out) == before


DNA = "ACGTTGCAnnACGTRYACGGATTACAgg"  # mixed case, an N run and ambiguity codes: one record of 28 bases


def _checkpoint(folder: Path, tok: SeqTokenizer, vocab_size: int | None = None) -> Path:
    """A model trained on windows of `tok` as the trainer saves it (hf_folder.save_model): lcft.json records the
    tokenizer's spec as prepare does, the files of a model tokenizer beside; config.json's vocab_size its size."""
    char = tok.name == "dna-char"
    torch.manual_seed(0)
    save_pretrained(Llama(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=vocab_size or tok.vocab_size)),
                    folder, tokenizer=tokenizer_spec() if char else tok.spec(), hf_tokenizer=None if char else tok)
    return folder


def _ids(tok: SeqTokenizer, seq: str) -> list[int]:
    """The ids lcft trains on for the record `seq` (its char vocabulary's own encoder, or the tokenizer's)."""
    if tok.name == "dna-char":
        return char_encode(seq).tolist()
    return tok.encode_chunk(np.frombuffer(seq.upper().encode(), np.uint8), np.array([0, len(seq)]))[0].tolist()


@pytest.mark.parametrize("kind", ["kmer:3", "char"])
def test_export_writes_the_recorded_tokenizer(tmp_path, kind):
    """The tokenizer.json an export writes, read by the `tokenizers` library, encodes DNA to the ids lcft trains
    on, for the export of an export too. A k-mer checkpoint whose tokenizer.json was gone exported lcft's char
    vocabulary (9 tokens for a model of 74, lcft.json saying kmer:3); an export of a char export lost the
    mapping of ambiguity codes to N (the tokenizer.json read back as a 1-mer vocabulary)."""
    tok = load_tokenizer(kind)
    ckpt = _checkpoint(tmp_path / "ckpt", tok)
    (ckpt / "tokenizer.json").unlink(missing_ok=True)  # (a char checkpoint carries none)
    out, again = tmp_path / "hf", tmp_path / "hf2"
    for src, dst in ((ckpt, out), (out, again)):
        r = CliRunner().invoke(app, ["export", str(src), "--out", str(dst)])
        assert r.exit_code == 0, r.output
        got = Tokenizer.from_file(str(dst / "tokenizer.json"))
        assert json.loads((dst / "config.json").read_text())["vocab_size"] == tok.vocab_size
        assert got.get_vocab_size() == len([t for t in tok.vocab if t != "?"])
        assert got.encode(DNA).ids == _ids(tok, DNA), dst.name


def _foreign(tmp_path: Path, kind: str) -> tuple[Path, tuple[str, ...]]:
    """A checkpoint whose tokenizer files are not the tokenizer its lcft.json records, or are missing where
    lcft cannot rebuild them; what the error names."""
    kmer, char = load_tokenizer("kmer:3"), load_tokenizer("char")
    if kind.startswith("char file in a kmer"):  # char's file in a kmer:1 checkpoint was taken for the 1-mers:
        k = kind.removeprefix("char file in a kmer:").partition(" ")[0]  # (it maps ambiguity codes to N, not <unk>)
        ckpt = _checkpoint(tmp_path / "ckpt", load_tokenizer(f"kmer:{k}"))
        save_hf_tokenizer(char, tmp_path / "char")
        shutil.copy(tmp_path / "char" / "tokenizer.json", ckpt / "tokenizer.json")
        return ckpt, ("tokenizer.json gives other ids", f"name 'dna-char' vs 'kmer:{k}'")
    if kind == "kmer file in a char checkpoint":
        torch.manual_seed(0)
        ckpt = save_pretrained(Llama(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                                 num_attention_heads=2, num_key_value_heads=2)), tmp_path / "ckpt")
        save_hf_tokenizer(kmer, ckpt)
        return ckpt, ("tokenizer.json gives other ids", "dna-char with 16 tokens", "vocab_size 74 vs 16")
    if kind == "kmer vocab.txt of its own, tokenizer.json gone":
        vocab = tmp_path / "vocab.txt"
        vocab.write_text("\n".join(kmer.vocab[:10] + kmer.vocab[10:][::-1]) + "\n")
        ckpt = _checkpoint(tmp_path / "ckpt", load_tokenizer(f"kmer:3:{vocab}"))
        (ckpt / "tokenizer.json").unlink()
        return ckpt, ("has no tokenizer.json", "kmer:3 with 74 tokens", "not one lcft can rebuild")
    ckpt = _checkpoint(tmp_path / "ckpt", kmer, vocab_size=16)  # the embedding has fewer rows than tokens
    return ckpt, ("kmer:3 with 74 tokens", "more tokens than the model's embedding has rows", "vocab_size 16")


@pytest.mark.parametrize("kind", ["char file in a kmer:3 checkpoint", "char file in a kmer:1 checkpoint",
                                  "kmer file in a char checkpoint",
                                  "kmer vocab.txt of its own, tokenizer.json gone", "more tokens than rows"])
def test_export_refuses_a_tokenizer_other_than_the_recorded_one(tmp_path, kind):
    ckpt, needles = _foreign(tmp_path, kind)
    before = sorted(os.listdir(tmp_path))
    cli_fails(["export", str(ckpt), "--out", str(tmp_path / "hf")], *needles)
    assert sorted(os.listdir(tmp_path)) == before  # no --out, nor a work folder beside it


@pytest.mark.parametrize("model", [{"type": "WordLevel", "vocab": {}, "unk_token": "<unk>"},
                                   {"type": "Unigram", "unk_id": None, "vocab": []}])
def test_export_of_a_model_folder_whose_tokenizer_has_no_tokens_is_one_line(tmp_path, model):
    """A model folder holding a tokenizer.json with no token (none in its model, no added_tokens): the export
    reads it as prepare does and said so in a ValueError traceback (max() of an empty vocabulary)."""
    folder = _checkpoint(tmp_path / "m", load_tokenizer("char"))
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}))
    cli_fails(["export", str(folder), "--out", str(tmp_path / "hf")], str(folder / "tokenizer.json"),
              "the vocabulary has no tokens")
    assert not (tmp_path / "hf").exists()


GENERATION = b'{\n  "eos_token_id": [2, 3],\n  "max_length": 4096,\n  "temperature": 0.7\n}\n'


def _said(text: str) -> str:
    return "".join(text.split())  # the console wraps long paths anywhere


def test_export_carries_the_generation_config_and_its_record(tmp_path, init_dir):
    """A source's generation_config.json is exported byte for byte and recorded with the export's files: the same
    export run again is "already exported"; the source's file changed makes it another source (refused without
    --force); --force from a source without one leaves none (the earlier export's would give this model another's
    settings), and that export run again is "already exported"."""
    source, out = tmp_path / "model", tmp_path / "hf"
    shutil.copytree(init_dir, source)
    (source / "generation_config.json").write_bytes(GENERATION)
    args = ["export", str(source), "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert (out / "generation_config.json").read_bytes() == GENERATION
    files = json.loads((out / "lcft.json").read_text())["export"]["files"]
    assert files["generation_config.json"]["bytes"] == len(GENERATION)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {out} (from {source})"), r.output
    (source / "generation_config.json").write_bytes(GENERATION.replace(b"0.7", b"0.9"))
    cli_fails(args, f"{out} already holds an export of another checkpoint")
    assert (out / "generation_config.json").read_bytes() == GENERATION
    again = ["export", str(init_dir), "--out", str(out)]
    assert CliRunner().invoke(app, [*again, "--force"]).exit_code == 0
    assert not (out / "generation_config.json").exists()
    r = CliRunner().invoke(app, again)
    assert r.exit_code == 0 and _said(r.output) == _said(f"already exported to {out} (from {init_dir})"), r.output


@pytest.mark.parametrize("bad, said", [("[]", "generation_config.json: not a JSON object"),
                                       ("oversize", "bytes, over the limit of 16777216")])
def test_export_of_a_bad_generation_config_is_one_line_and_writes_nothing(tmp_path, init_dir, bad, said):
    source, out = tmp_path / "model", tmp_path / "hf"
    shutil.copytree(init_dir, source)
    with (source / "generation_config.json").open("wb") as f:
        if bad == "oversize":
            f.truncate((16 << 20) + 1)  # sparse: refused by its size, unread
        else:
            f.write(bad.encode())
    cli_fails(["export", str(source), "--out", str(out)], str(source / "generation_config.json"), said)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
