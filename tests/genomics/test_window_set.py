"""A prepared folder whose files were changed and whose manifest was made to match them (every sha256 right, so
`lcft prepare verify` passes): the reader refuses what the model or the by-base figures would compute with in one
line, before any id reaches the embedding (an IndexError on CPU, a device-side assert on CUDA) and before a base
count makes bits per base wrong."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.genomics.shards import MANIFEST
from lcft.genomics.window_set import bases_name
from tests.one_line import one_line


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    d = tmp_path_factory.mktemp("window_set")
    for spec in ("char", "kmer:2"):
        prepare_windows(fasta=str(sample_fasta()), out=str(d / spec.replace(":", "")), length=1024, train="chr2",
                        eval="chr22", tokenizer=spec)
    return d


def _changed(prepared: Path, tmp_path: Path, kind: str, name: str, change) -> Path:
    """A copy of the `kind` folder with file `name`'s array changed by `change` (in place) and the manifest's
    size and sha256 of it made to match."""
    folder = tmp_path / kind
    shutil.copytree(prepared / kind, folder)
    path = folder / name
    dtype = np.uint16 if name.endswith(".bases.bin") else np.dtype(json.loads((folder / MANIFEST).read_text()).get(
        "ids_dtype", "uint8"))
    data = np.fromfile(path, dtype=dtype)
    change(data)
    data.tofile(path)
    manifest = json.loads((folder / MANIFEST).read_text())
    for info in [manifest.get("files", {}), *(s["files"] for s in manifest["splits"].values())]:
        if name in info:
            info[name] = {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("kind", ["char", "kmer2"])
def test_an_id_outside_the_vocabulary_is_one_line(prepared, tmp_path, kind):
    vocab = open_windows(prepared / kind, "eval").vocab_size

    def past_the_vocabulary(ids: np.ndarray) -> None:
        ids[1024 + 100] = vocab  # window 1

    ws = open_windows(_changed(prepared, tmp_path, kind, "eval.bin", past_the_vocabulary), "eval")
    assert ws[0] is not None
    one_line(lambda: ws[1], "eval.bin: window 1 holds token id", f"outside the windows' vocabulary of {vocab}")


def test_an_id_outside_the_vocabulary_stops_eval_before_the_model(prepared, tmp_path):
    """Through `lcft eval`: one line, exit 1 (it was an IndexError traceback from the embedding)."""
    from typer.testing import CliRunner

    from lcft.checkpoint.hf_folder import save_pretrained
    from lcft.cli.app import app
    from lcft.model import Llama, preset

    folder = _changed(prepared, tmp_path, "char", "eval.bin", lambda ids: ids.__setitem__(5, 200))
    save_pretrained(Llama(preset("tiny")), tmp_path / "model")
    res = CliRunner().invoke(app, ["eval", "--data", str(folder), "-c", str(tmp_path / "model"), "--out",
                                   str(tmp_path / "out"), "--max-windows", "1", "--bootstrap", "10"])
    last = res.output.strip().splitlines()[-1]  # (after the progress line)
    assert res.exit_code == 1 and last.startswith("error: ") and "window 0 holds token id 200" in last, res.output
    assert "Traceback" not in res.output and not (tmp_path / "out" / "eval.json").exists()


def test_token_bases_that_do_not_add_up_to_the_window_are_one_line(prepared, tmp_path):
    """A window's tokens holding more bases than its record spans (`--position bases` indexed past the window;
    bits per base came out 30,000 times too small)."""
    def doubled(counts: np.ndarray) -> None:
        counts[: 1024] *= 2  # window 0

    ws = open_windows(_changed(prepared, tmp_path, "kmer2", bases_name("eval"), doubled), "eval")
    start, end = ws.coords(0)[1:]
    one_line(lambda: ws.token_bases(0), "eval.bases.bin: window 0's tokens hold",
             f"bases, its record {end - start}")
    assert ws.token_bases(1).sum() == ws.coords(1)[2] - ws.coords(1)[1]


def test_a_char_window_spanning_other_than_its_length_is_one_line(prepared, tmp_path):
    folder = tmp_path / "char"
    shutil.copytree(prepared / "char", folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    record = next(r for r in manifest["records"] if r["split"] == "eval")
    record["end"] = record["start"] + 1
    (folder / MANIFEST).write_text(json.dumps(manifest))
    one_line(lambda: open_windows(folder, "eval"), "corrupt manifest (a eval window spans other than its 1024 bases)")
    assert len(open_windows(folder, "train")) > 0


def _with_tokenizer_file(prepared: Path, tmp_path: Path, write) -> Path:
    """A copy of the kmer2 folder whose tokenizer.json is replaced by `write(path)`; the manifest lists no file for
    it (as a folder prepared by someone else may), so only the reader stands between it and the model."""
    folder = tmp_path / "kmer2"
    shutil.copytree(prepared / "kmer2", folder)
    (folder / "tokenizer.json").unlink()
    write(folder / "tokenizer.json")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = {}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_tokenizer_json_not_in_utf8_is_one_line(prepared, tmp_path):
    """(It was a UnicodeDecodeError traceback out of the counted-label table train and eval build.)"""
    folder = _with_tokenizer_file(prepared, tmp_path, lambda p: p.write_bytes(b"\xff\xfe{}"))
    one_line(lambda: open_windows(folder, "eval").counted, "tokenizer.json: cannot read it")


def test_a_fifo_in_place_of_the_tokenizer_json_is_one_line_not_a_hang(prepared, tmp_path):
    """(Reading it blocked forever: `lcft eval --data` hung before the first window.)"""
    import os
    import signal

    folder = _with_tokenizer_file(prepared, tmp_path, os.mkfifo)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the reader blocked on the FIFO"))
    signal.alarm(20)
    try:
        one_line(lambda: open_windows(folder, "eval").counted, "tokenizer.json is not a regular file")
    finally:
        signal.alarm(0)


def test_a_tokenizer_json_other_than_the_manifest_records_is_one_line(prepared, tmp_path):
    """A smaller vocabulary kept in the folder (its size and sha256 listed, so verify passes): the labels were
    looked up in its counted table, an IndexError out of training's first batch."""
    from lcft.genomics.dataset import DataConfig, TrainSamples
    from lcft.genomics.model_tokenizer import load_tokenizer

    def smaller(path: Path) -> None:
        path.write_text(load_tokenizer("kmer:1").json_text)

    folder = _with_tokenizer_file(prepared, tmp_path, smaller)
    path = folder / "tokenizer.json"
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = {path.name: {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    ws = open_windows(folder, "train")
    one_line(lambda: TrainSamples(ws, DataConfig(ws.length)).example(0),
             "tokenizer.json is not the tokenizer", "records (9 tokens", "prepare the windows again")


def test_a_window_length_not_a_multiple_of_8_is_one_line(prepared, tmp_path):
    """Windows of 12 tokens with every file the size the manifest asks (12 bytes of ids, 1.5 bytes of soft mask
    a window): a window's soft mask read back as 8 bits, a broadcast ValueError in sequence() and training."""
    folder = tmp_path / "char"
    shutil.copytree(prepared / "char", folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["length"], records = 12, [r for r in manifest["records"] if r["split"] == "eval"][:2]
    manifest["records"] = [{**r, "end": r["start"] + 12} for r in records]
    (folder / "eval.bin").write_bytes(bytes([4, 5, 6, 7] * 6))
    (folder / "eval.softmask.bin").write_bytes(bytes(3))
    (folder / MANIFEST).write_text(json.dumps(manifest))
    one_line(lambda: open_windows(folder, "eval").sequence(0), "corrupt manifest ('length'")


def test_a_manifest_given_for_its_folder_names_the_folder(prepared):
    """--data w/manifest.json had been 'w/manifest.json is not a prepared windows folder (no manifest.json)'."""
    one_line(lambda: open_windows(prepared / "kmer2" / MANIFEST, "eval"),
             f"{prepared / 'kmer2' / MANIFEST} is a windows folder's manifest: give the folder {prepared / 'kmer2'}")


def test_a_missing_split_file_names_a_verify_command_that_runs_as_pasted(tmp_path):
    """A folder with a space in its name: the `lcft prepare verify` suggested quotes it, one word for the shell."""
    import shlex

    out = tmp_path / "my windows"
    (tmp_path / "g.fa").write_text(">chrA\n" + "ACGT" * 64 + "\n")
    prepare_windows(fasta=str(tmp_path / "g.fa"), out=str(out), length=64, train=("chrA",), eval=())
    (out / "train.bin").unlink()
    msg = one_line(lambda: open_windows(out, "train"), "is missing")
    assert shlex.split(msg.split("`")[1]) == ["lcft", "prepare", "verify", str(out)], msg
