"""Property-based fuzzing of every file lcft reads from a folder it is handed (config.json, lcft.json,
tokenizer.json, vocab.txt, manifest.json, checksums.json, the safetensors header, metrics.jsonl and a trainer
state.json on resume, a FASTA's .fai found beside it, and the
two pickles it reads without running them: a sharded checkpoint's DCP .metadata and a pytorch_model.bin's data.pkl,
and that .bin's zip around it):
random byte and JSON-value mutations of a real file either load or raise the one-line user error (LcftError),
never another exception, each within a bounded time, and the process's peak memory stays bounded."""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcft.checkpoint.dcp_metadata import read_metadata_file
from lcft.checkpoint.hf_folder import from_pretrained, read_config, save_pretrained
from lcft.checkpoint.layout import resolve_checkpoint, verify_checkpoint
from lcft.checkpoint.save import write_checksums
from lcft.checkpoint.state import TrainerState, read_trainer_state, write_trainer_state
from lcft.errors import LcftError
from lcft.genomics import open_windows, prepare_windows, sample_fasta, verify_windows
from lcft.genomics.fasta import FastaFile
from lcft.genomics.hf_tokenizer import hf_tokenizer_json
from lcft.genomics.model_tokenizer import load_tokenizer
from lcft.model import Llama, LlamaConfig
from lcft.train.metrics import MetricsLog

EXAMPLES = 30  # per file: 13 files in about a minute on 2 busy cores
SECONDS = 20.0  # one load of a mutated small file; a bomb (an allocation, a loop over a declared count) is far slower
PEAK_GROWTH = 1 << 30  # bytes of peak RSS the whole fuzz may add

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64) | st.floats() |
    st.sampled_from([0, -1, 2**31, 2**32 - 1, 10**9, 10**18]) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (dict keys, list indices)."""
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:16]):
            out += _paths(v, (*at, i))
    return out


def _set(node: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = node
    for k in path[:-1]:
        parent = parent[k]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return node


@st.composite
def mutated(draw, original: bytes, is_json: bool) -> bytes:
    """One mutation of a file's bytes: a JSON value replaced or deleted, bytes overwritten, inserted or cut."""
    kind = draw(st.sampled_from(["value", "delete", "bytes", "insert", "truncate"] if is_json else
                                ["bytes", "insert", "truncate"]))
    if kind in ("value", "delete"):
        doc = json.loads(original)
        path = draw(st.sampled_from(_paths(doc)[1:] or [()]))
        doc = _set(doc, path, draw(json_values), delete=kind == "delete" and bool(path))
        return json.dumps(doc).encode()
    data = bytearray(original)
    at = draw(st.integers(0, max(0, len(data) - 1)))
    if kind == "truncate":
        return bytes(data[:at])
    blob = draw(st.binary(min_size=1, max_size=16))
    if kind == "insert":
        return bytes(data[:at] + blob + data[at:])
    data[at:at + len(blob)] = blob
    return bytes(data)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, Path]:
    """Real files of each kind, as lcft writes them (or a published k-mer layout)."""
    root = tmp_path_factory.mktemp("fuzz-seeds")
    model = root / "model"
    torch.manual_seed(0)
    save_pretrained(Llama(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)), model)
    write_checksums(model)
    tok = root / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(hf_tokenizer_json(load_tokenizer("kmer:3")))
    vocab = root / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(load_tokenizer("kmer:2").vocab) + "\n")
    windows = root / "windows"
    prepare_windows(fasta=str(sample_fasta()), out=str(windows), length=1024, train=("chr2",), eval=("chr22",),
                    tokenizer="kmer:3")
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4)))
    sharded = root / "dcp"
    dcp.save({"w": torch.randn(4, 8), "opt": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(8)}},
             checkpoint_id=str(sharded), no_dist=True)  # DCP's own .metadata, as a sharded save writes it
    binned = root / "bin"
    shutil.copytree(model, binned)
    state = {k: v.clone() for k, v in from_pretrained(binned).state_dict().items()}
    (binned / "model.safetensors").unlink()
    torch.save(state, binned / "pytorch_model.bin")  # torch's own zip, its data.pkl beside it to mutate
    (binned / "data.pkl").write_bytes(_pkl_of(binned / "pytorch_model.bin").read())
    fasta = root / "fasta"
    fasta.mkdir()
    (fasta / "g.fa").write_text(">a first\n" + "ACGTN" * 60 + "\n>b\n" + "acgt\n" * 20)
    FastaFile(fasta / "g.fa").close()  # pyfaidx writes g.fa.fai beside it
    resumed = root / "resumed"
    resumed.mkdir()
    opt = torch.optim.AdamW(torch.nn.Linear(4, 2).parameters())
    opt.step()  # a state per parameter, as a run's first update leaves it
    write_trainer_state(resumed, TrainerState(step=3, updates=3, guard_history=[1.5]), opt.state_dict(),
                        torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0).state_dict())
    return {"model": model, "tok": tok, "vocab": vocab, "windows": windows, "run": run, "dcp": sharded, "bin": binned,
            "fasta": fasta, "resumed": resumed}


def _read_fasta(d: Path) -> None:
    """The FASTA with its (mutated) index found in place: newer than the file, so pyfaidx would use it as is."""
    os.utime(d / "g.fa.fai")
    with FastaFile(d / "g.fa") as f:
        for name in f.names:
            f.read_raw(name, 0, f.length(name))


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
    verify_windows(d)
    ws = open_windows(d, "train")
    ws.tokenizer.vocab_size  # noqa: B018 (the tokenizer file the manifest names is read)
    _ = ws[0]


def _metrics(d: Path) -> None:
    MetricsLog(d / "metrics.jsonl", resume_step=2).close()


CASES: dict[str, tuple[str, str, Callable[[Path], Any]]] = {
    # name: (seed folder, file, what lcft does with the folder)
    "config.json": ("model", "config.json", lambda d: (read_config(d), from_pretrained(d))),
    "lcft.json": ("model", "lcft.json", lambda d: (resolve_checkpoint(d), read_config(d))),
    "checksums.json": ("model", "checksums.json", verify_checkpoint),
    "safetensors header": ("model", "model.safetensors", from_pretrained),
    "tokenizer.json": ("tok", "tokenizer.json", lambda d: load_tokenizer(str(d))),
    "vocab.txt": ("vocab", "vocab.txt", lambda d: load_tokenizer(str(d))),
    "manifest.json": ("windows", "manifest.json", _read_windows),
    "metrics.jsonl": ("run", "metrics.jsonl", _metrics),
    "dcp .metadata": ("dcp", ".metadata", lambda d: read_metadata_file(d / ".metadata")),
    "bin data.pkl": ("bin", "data.pkl", _read_bin),
    "bin zip": ("bin", "pytorch_model.bin", from_pretrained),  # its directory, headers and records as bytes
    ".fai": ("fasta", "g.fa.fai", _read_fasta),
    "state.json": ("resumed", "trainer_state/state.json", read_trainer_state),
}


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


@pytest.mark.parametrize("case", list(CASES))
def test_a_mutated_file_loads_or_is_a_one_line_error(case, seeds, tmp_path):
    seed, name, load = CASES[case]
    work = tmp_path / "work"
    shutil.copytree(seeds[seed], work)
    original = (work / name).read_bytes()
    if name == "model.safetensors":  # the header: its 8-byte length and JSON (the tensor bytes are data)
        original = original[: 8 + int.from_bytes(original[:8], "little")]
    is_json = name.endswith(".json")
    rest = (seeds[seed] / name).read_bytes()[len(original):]
    before = _peak_rss()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=mutated(original, is_json))
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
