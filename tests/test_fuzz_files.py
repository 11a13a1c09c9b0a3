"""Property-based fuzzing of every file lcft reads from a folder it is handed (config.json, lcft.json,
tokenizer.json, vocab.txt, manifest.json, checksums.json, the safetensors header and a sharded model's
index.json, a tokenizer's tokenizer_config.json and special_tokens_map.json, metrics.jsonl, a run's config.toml
and an eval.toml, a FASTA's .fai and a BGZF FASTA's .fai and .gzi
found beside it; on resume the trainer state's state.json, optimizer.pt, scheduler.pt and rng.pt, and a sharded
checkpoint's param_groups.json; and the two pickles it reads without running them: a sharded checkpoint's DCP
.metadata and a pytorch_model.bin's data.pkl, and that .bin's zip around it): random byte mutations, and JSON,
TOML or (torch files) value mutations, of a real file that loads either load or raise the one-line user error
(LcftError), never another exception, each within a bounded time, and the process's peak memory stays bounded.
Seeds are files lcft writes, or files as published (../shared/published: DNABERT-6's vocab.txt,
tokenizer_config.json and special_tokens_map.json, METAGENE-1's BPE tokenizer.json, config.json and the same two).
A resume is exercised to its end (everything restored, then one update), a windows folder through what `prepare
verify`/`inspect` and a training run read, a tokenizer by cutting, verifying and spelling windows with it, a
published config by building its model on the meta device, and a sound FASTA's bases read exactly as Biopython
reads them whatever its indexes say (the FASTA text itself: tests/genomics/test_fasta_text.py)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil
import tempfile
import time
import tomllib
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from Bio import bgzf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from typer.testing import CliRunner

from lcft.checkpoint.dcp import save_state
from lcft.checkpoint.dcp_metadata import read_metadata_file
from lcft.checkpoint.hf_folder import from_pretrained, read_config, save_pretrained
from lcft.checkpoint.layout import check_tokenizer, resolve_checkpoint, verify_checkpoint
from lcft.checkpoint.model_files import SHARDED_META
from lcft.checkpoint.reader import load
from lcft.checkpoint.resume import restore_training
from lcft.checkpoint.save import write_checksums
from lcft.checkpoint.state import TrainerState, rng_state, set_rng_state, write_trainer_state
from lcft.cli.app import app
from lcft.config_build import build
from lcft.config_toml import dumps_toml, load_toml, save_resolved, to_dict
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.genomics import open_windows, prepare_windows, sample_fasta, verify_windows
from lcft.genomics.fasta import FastaFile
from lcft.genomics.hf_tokenizer import describe, hf_tokenizer_json
from lcft.genomics.model_tokenizer import load_tokenizer
from lcft.genomics.shards import read_manifest
from lcft.model import Llama, LlamaConfig
from lcft.train.config import TrainConfig, load_run_config, resolve_config
from lcft.train.metrics import MetricsLog
from lcft.vocab import tokenizer_spec
from tests.conftest import SHARED_PUBLISHED as PUBLISHED
from tests.genomics.conftest import bio_records

PUBLISHED_VOCAB = PUBLISHED / "dnabert-6" / "vocab.txt"
TINY = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2)
EXAMPLES = 30  # per file: 28 files in about 15 s on 2 AMD EPYC cores
SECONDS = 20.0  # one load of a mutated small file; a bomb (an allocation, a loop over a declared count) is far slower
PEAK_GROWTH = 1 << 30  # bytes of peak RSS the whole fuzz may add

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64) | st.floats() |
    st.sampled_from([0, -1, 2**31, 2**32 - 1, 10**9, 10**18]) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
tensors = st.builds(lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
                    st.lists(st.integers(0, 3), max_size=3),
                    st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8,
                                     torch.bool]),
                    st.sampled_from([0.0, 1.0, -1.0, 1e30, float("nan"), float("inf")]))
torch_values = json_values | tensors  # what torch.load(weights_only=True) gives back: containers, numbers, tensors


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every path into a JSON value or a torch file's object (dict keys, list and tuple indices)."""
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*at, k))
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node[:16]):
            out += _paths(v, (*at, i))
    return out


def _replaced(node: Any, path: tuple, value: Any, delete: bool) -> Any:
    """`node` with the item at `path` set to `value` (or deleted), tuples rebuilt as tuples."""
    if not path:
        return value
    k, rest = path[0], path[1:]
    items = dict(node) if isinstance(node, dict) else list(node)
    if delete and not rest:
        del items[k]
    else:
        items[k] = _replaced(items[k], rest, value, delete)
    return tuple(items) if isinstance(node, tuple) else items


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


toml_values = st.recursive(  # what lcft's TOML writer writes: no null, tables one level deep
    st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.floats() | st.text(max_size=12) |
    st.sampled_from([0, -1, 2**31, 10**18, "512K", "1M", "fsdp", "bf16"]),
    lambda inner: st.lists(inner, max_size=4), max_leaves=8)
FORMS: dict[str, tuple[Callable[[bytes], Any], Any, Callable[[Any], bytes]]] = {  # read, values, write
    "json": (json.loads, json_values, lambda doc: json.dumps(doc).encode()),
    "torch": (lambda b: torch.load(io.BytesIO(b), weights_only=True), torch_values, lambda doc: _torch_bytes(doc)),
    "toml": (lambda b: tomllib.loads(b.decode()), toml_values, lambda doc: dumps_toml(doc).encode()),
}


class Mutated(bytes):
    """A mutated file's bytes, shown in a failure report as the mutation that made them (derandomized: a rerun
    makes the same ones), not as up to a megabyte of bytes."""

    how: str

    def __repr__(self) -> str:
        return f"<{len(self)} bytes: {self.how}>"


def _made(data: bytes, how: str) -> Mutated:
    out = Mutated(data)
    out.how = how[:300]
    return out


@st.composite
def mutated(draw, original: bytes, form: str) -> Mutated:
    """One mutation of a file's bytes: a value of its JSON or torch object replaced or deleted, bytes
    overwritten, inserted or cut. form: "json", "torch" or "bytes"."""
    kind = draw(st.sampled_from(["bytes", "insert", "truncate"] + ["value", "delete"] * (form != "bytes")))
    if kind in ("value", "delete"):
        read, values, write = FORMS[form]
        doc = read(original)
        path = draw(st.sampled_from(_paths(doc)[1:] or [()]))
        value = draw(values)
        doc = _replaced(doc, path, value, delete=kind == "delete" and bool(path))
        return _made(write(doc), f"{kind} at {path!r}: {value!r}")
    data = bytearray(original)
    at = draw(st.integers(0, max(0, len(data) - 1)))
    if kind == "truncate":
        return _made(bytes(data[:at]), f"cut at {at}")
    blob = draw(st.binary(min_size=1, max_size=16))
    if kind == "insert":
        return _made(bytes(data[:at] + blob + data[at:]), f"{blob!r} inserted at {at}")
    data[at:at + len(blob)] = blob
    return _made(bytes(data), f"{blob!r} written at {at}")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, Path]:
    """Real files of each kind, as lcft writes them (or as published: DNABERT-6's vocab.txt)."""
    root = tmp_path_factory.mktemp("fuzz-seeds")
    model = root / "model"
    torch.manual_seed(0)
    save_pretrained(Llama(TINY), model, tokenizer=tokenizer_spec())  # lcft.json records the char tokenizer
    write_checksums(model)
    indexed = root / "indexed"
    save_pretrained(from_pretrained(model), indexed, max_shard_size=4096)  # several shards and their index.json
    tok = root / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(hf_tokenizer_json(load_tokenizer("kmer:3")))
    vocab = root / "vocab"
    vocab.mkdir()
    if PUBLISHED_VOCAB.is_file():  # DNABERT-6's vocab.txt as published: specials, then the 4,096 6-mers
        shutil.copy(PUBLISHED_VOCAB, vocab / "vocab.txt")
    metagene, dnabert = root / "metagene", root / "dnabert"  # METAGENE-1's and DNABERT-6's files as published
    for folder, name in ((metagene, "metagene-1"), (dnabert, "dnabert-6")):
        if (PUBLISHED / name).is_dir():
            shutil.copytree(PUBLISHED / name, folder)
            folder.chmod(0o755)
            for f in folder.iterdir():
                f.chmod(0o644)
    windows = root / "windows"
    prepare_windows(fasta=str(sample_fasta()), out=str(windows), length=1024, train=("chr2",), eval=("chr22",),
                    tokenizer="kmer:3")
    kmer3 = read_manifest(windows)["tokenizer"]
    save_pretrained(Llama(dataclasses.replace(TINY, vocab_size=kmer3["vocab_size"])), windows / "model",
                    tokenizer=kmer3)  # a model of the data's tokenizer, which training checks against it
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4)))
    sharded = root / "dcp"
    dcp.save({"w": torch.randn(4, 8), "opt": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(8)}},
             checkpoint_id=str(sharded), no_dist=True)  # DCP's own .metadata, as a sharded save writes it
    binned = root / "bin"
    shutil.copytree(model, binned)
    state = load_file(binned / "model.safetensors")  # the HF names a published .bin holds
    (binned / "model.safetensors").unlink()
    torch.save(state, binned / "pytorch_model.bin")  # torch's own zip, its data.pkl beside it to mutate
    (binned / "data.pkl").write_bytes(_pkl_of(binned / "pytorch_model.bin").read())
    fasta = root / "fasta"
    fasta.mkdir()
    (fasta / "g.fa").write_text(">a first\n" + "ACGTN" * 60 + "\n>b\n" + "acgt\n" * 20)
    FastaFile(fasta / "g.fa").close()  # pyfaidx writes g.fa.fai beside it
    bgzf_fasta = root / "bgzf"
    bgzf_fasta.mkdir()
    with bgzf.BgzfWriter(str(bgzf_fasta / "g.fa.gz"), "wb") as w:  # blocks of 64 KiB: several .gzi entries
        for name, seed in (("a", 1), ("b", 2), ("c", 3)):
            rng = random.Random(seed)
            w.write(f">{name}\n" + "".join("".join(rng.choices("ACGT", k=60)) + "\n" for _ in range(1500)))
    FastaFile(bgzf_fasta / "g.fa.gz").close()  # g.fa.gz.fai and g.fa.gz.gzi beside it
    configs = root / "configs"
    configs.mkdir()
    save_resolved(configs / "config.toml", to_dict(TrainConfig(data=str(windows), init=str(model), seq_len=1024)))
    save_resolved(configs / "eval.toml", to_dict(EvalConfig(data=str(windows), checkpoints=(str(model),))))
    resumed, sharded_run = _checkpoint(model, root / "resumed", False), _checkpoint(model, root / "sharded-run", True)
    return {"model": model, "tok": tok, "vocab": vocab, "windows": windows, "run": run, "dcp": sharded, "bin": binned,
            "fasta": fasta, "resumed": resumed, "sharded-run": sharded_run, "indexed": indexed, "bgzf": bgzf_fasta,
            "configs": configs, "metagene": metagene, "dnabert": dnabert}


def _trained(model: Path) -> tuple[Llama, torch.optim.Optimizer, Any]:
    """The model config.json describes, an AdamW over it and its schedule: as `_resume` builds them (the
    weights do not matter: a resume reads them elsewhere), or (saved) after 3 updates."""
    net = Llama(read_config(model))
    opt = torch.optim.AdamW(net.parameters())
    return net, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0)


def _checkpoint(model: Path, out: Path, sharded: bool) -> Path:
    """A checkpoint after 3 updates: model folder and trainer state; sharded: weights and optimizer in dcp/."""
    shutil.copytree(model, out)
    net, opt, sched = _trained(model)
    for _ in range(3):
        sum(p.sum() for p in net.parameters()).backward()
        opt.step()
        sched.step()
    if sharded:
        (out / "model.safetensors").unlink()
        (out / "lcft.json").write_text(json.dumps({**json.loads((out / "lcft.json").read_text()), **SHARDED_META}))
        with warnings.catch_warnings():  # DCP warns that it saves in one process: that is what is wanted
            warnings.simplefilter("ignore")
            save_state(net, opt, out)
    write_trainer_state(out, TrainerState(step=3, updates=3, guard_history=[1.5]),
                        None if sharded else opt.state_dict(), sched.state_dict())
    return out


def _resume(d: Path) -> None:
    """A one-process resume from the folder to its end: everything restored into what this run built (the
    model read again, a fresh AdamW and schedule), then one update; this process's RNGs put back after."""
    net, opt, sched = _trained(d)
    before = rng_state()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            restore_training(d, net, opt, sched, sharded=False)
        sum(p.sum() for p in net.parameters()).backward()
        opt.step()
        sched.step()
    finally:
        set_rng_state(before)


def _read_fasta(d: Path) -> None:
    _read_as_written(d / "g.fa", ["g.fa.fai"])


def _read_bgzf(d: Path) -> None:
    _read_as_written(d / "g.fa.gz", ["g.fa.gz.fai", "g.fa.gz.gzi"])


def _read_as_written(fasta: Path, indexes: list[str]) -> None:
    """A sound FASTA with (mutated) indexes found in place, newer than it (pyfaidx uses such an index as it is):
    whatever they say, every base reads as Biopython reads the file; an error would be a fault of lcft's."""
    for index in indexes:
        os.utime(fasta.parent / index)
    want = bio_records(fasta)
    try:
        with FastaFile(fasta) as f:
            got = {n: f.read_raw(n, 0, f.length(n)).replace(b"\n", b"").decode() for n in f.names}
    except LcftError as e:
        raise AssertionError(f"a damaged index beside a sound FASTA failed the read: {e}") from None
    assert got == want, "a damaged index beside a sound FASTA changed what was read"


def _pkl_of(path: Path) -> zipfile.ZipExtFile:
    z = zipfile.ZipFile(path)
    return z.open(next(i for i in z.infolist() if i.filename.endswith("/data.pkl")))


def _read_bin(d: Path) -> None:
    """The folder's pytorch_model.bin with data.pkl in its zip replaced by the (mutated) file beside it, read."""
    path = d / "pytorch_model.bin"
    with zipfile.ZipFile(path) as z:
        items = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in items:
            z.writestr(name, (d / "data.pkl").read_bytes() if name.endswith("/data.pkl") else data)
    from_pretrained(d)


def _read_windows(d: Path) -> None:
    """What lcft prepare verify and inspect, and a training run before its model, read of a windows folder."""
    manifest = verify_windows(d)
    for split in ("train", "eval"):
        ws = open_windows(d, split)
        ws.tokenizer.vocab_size  # noqa: B018 (the tokenizer file the manifest names is read)
        _ = ws[0], ws.sequence(0)
    check_tokenizer(d / "model", manifest["tokenizer"])
    for command in (["prepare", "verify", str(d)], ["prepare", "inspect", str(d)]):
        _cli(command)


def _cli(args: list[str]) -> None:
    """An lcft command: exit 0, or exit 1 with its one-line error; anything else raised as it was."""
    r = CliRunner().invoke(app, args)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    if r.exit_code:
        raise LcftError(r.output.strip())  # the line it printed (multi-line fails the caller's check)


def _tokenize_with(d: Path) -> None:
    """The tokenizer folder as lcft prepare windows uses it: windows cut from a small FASTA, verified, spelled."""
    load_tokenizer(str(d))
    out = Path(tempfile.mkdtemp(dir=d))
    fasta = out.parent / "g.fa"
    if not fasta.exists():
        fasta.write_text(">a\n" + "".join(random.Random(0).choices("ACGTN", weights=(9, 9, 9, 9, 1), k=6000)) + "\n")
    prepare_windows(fasta=str(fasta), out=str(out / "w"), length=256, train=("a",), eval=(), tokenizer=str(d),
                    max_n_frac=1.0, max_oov_frac=1.0)
    verify_windows(out / "w")
    ws = open_windows(out / "w", "train")
    _ = [ws.sequence(i) for i in range(len(ws))]


def _model_of(d: Path) -> None:
    """The model a published config.json describes, built on the meta device (its sizes, no storage)."""
    with torch.device("meta"):
        Llama(read_config(d))


def _metrics(d: Path) -> None:
    MetricsLog(d / "metrics.jsonl", resume_step=2).close()


CASES: dict[str, tuple[str, str, Callable[[Path], Any]]] = {
    # name: (seed folder, file, what lcft does with the folder)
    "config.json": ("model", "config.json", lambda d: (read_config(d), from_pretrained(d))),
    "lcft.json": ("model", "lcft.json", lambda d: (resolve_checkpoint(d), read_config(d),
                                                    check_tokenizer(d, tokenizer_spec()), describe(load(d).tokenizer))),
    "checksums.json": ("model", "checksums.json", verify_checkpoint),
    "safetensors header": ("model", "model.safetensors", from_pretrained),
    "tokenizer.json": ("tok", "tokenizer.json", _tokenize_with),
    "vocab.txt": ("vocab", "vocab.txt", _tokenize_with),
    "BPE tokenizer.json": ("metagene", "tokenizer.json", _tokenize_with),
    "published config.json": ("metagene", "config.json", _model_of),
    "published tokenizer_config.json": ("metagene", "tokenizer_config.json", _tokenize_with),
    "published special_tokens_map.json": ("metagene", "special_tokens_map.json", _tokenize_with),
    "k-mer tokenizer_config.json": ("dnabert", "tokenizer_config.json", _tokenize_with),  # may hold the k
    "k-mer special_tokens_map.json": ("dnabert", "special_tokens_map.json", _tokenize_with),
    "manifest.json": ("windows", "manifest.json", _read_windows),
    "metrics.jsonl": ("run", "metrics.jsonl", _metrics),
    "dcp .metadata": ("dcp", ".metadata", lambda d: read_metadata_file(d / ".metadata")),
    "bin data.pkl": ("bin", "data.pkl", _read_bin),
    "bin zip": ("bin", "pytorch_model.bin", from_pretrained),  # its directory, headers and records as bytes
    ".fai": ("fasta", "g.fa.fai", _read_fasta),
    "bgzf .fai": ("bgzf", "g.fa.gz.fai", _read_bgzf),
    ".gzi": ("bgzf", "g.fa.gz.gzi", _read_bgzf),  # BGZF block offsets: a declared count, then pairs
    "train config.toml": ("configs", "config.toml", lambda d: (resolve_config(d / "config.toml", {}),
                                                              load_run_config(d / "config.toml"))),
    "eval.toml": ("configs", "eval.toml", lambda d: build(EvalConfig, load_toml(d / "eval.toml"))),
    "state.json": ("resumed", "trainer_state/state.json", _resume),
    "optimizer.pt": ("resumed", "trainer_state/optimizer.pt", _resume),
    "scheduler.pt": ("resumed", "trainer_state/scheduler.pt", _resume),
    "rng.pt": ("resumed", "trainer_state/rng.pt", _resume),
    "param_groups.json": ("sharded-run", "dcp/param_groups.json", _resume),
    "index.json": ("indexed", "model.safetensors.index.json", from_pretrained),
}


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


@pytest.mark.parametrize("case", list(CASES))
def test_a_mutated_file_loads_or_is_a_one_line_error(case, seeds, tmp_path):
    seed, name, load = CASES[case]
    work = tmp_path / "work"
    if not (seeds[seed] / name).is_file():
        pytest.skip(f"published files not found at {PUBLISHED}")
    shutil.copytree(seeds[seed], work)
    original = (work / name).read_bytes()
    if name == "model.safetensors":  # the header: its 8-byte length and JSON (the tensor bytes are data)
        original = original[: 8 + int.from_bytes(original[:8], "little")]
    form = {".json": "json", ".pt": "torch", ".toml": "toml"}.get(Path(name).suffix, "bytes")
    rest = (seeds[seed] / name).read_bytes()[len(original):]
    load(work)  # the file as written loads: the mutations start from a working folder
    before = _peak_rss()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=mutated(original, form))
    def check(data: bytes) -> None:
        (work / name).write_bytes(data + rest)
        start = time.monotonic()
        try:
            load(work)
        except LcftError as e:
            assert "\n" not in str(e).strip(), f"{case}: a multi-line error: {e}"
        took = time.monotonic() - start
        assert took < SECONDS, f"{case}: {took:.1f} s to load a mutated file"

    check()
    assert _peak_rss() - before < PEAK_GROWTH, f"{case}: peak RSS grew by {(_peak_rss() - before) >> 20} MiB"
