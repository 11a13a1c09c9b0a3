"""Bad input to `evaluate`: a clear LcftError naming the problem, and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lcft.checkpoint.layout import EVAL_STEP, check_tokenizer
from lcft.config import ConfigError
from lcft.errors import LcftError
from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.report import JSON_NAME
from lcft.genomics import prepare_windows, sample_fasta

from .conftest import WINDOW, save_model


def _fails(tmp_path: Path, match: str, data, *ckpts, **kw) -> None:
    out = tmp_path / "out"
    with pytest.raises(LcftError, match=match) as e:  # some options are refused when the config is built
        evaluate(EvalConfig(data=str(data), checkpoints=tuple(str(c) for c in ckpts), out=str(out), max_windows=1, **kw))
    assert "\n" not in str(e.value)
    assert not out.exists()  # nothing half-written


def test_checkpoint_with_another_tokenizer(data_dir, ckpt_a, tmp_path):
    other = shutil.copytree(ckpt_a, tmp_path / "other-tokenizer")
    meta = json.loads((other / "lcft.json").read_text())
    meta["tokenizer"] = {**meta["tokenizer"], "name": "dna-kmer3", "vocab_size": 80}
    (other / "lcft.json").write_text(json.dumps(meta))
    _fails(tmp_path, "different tokenizer", data_dir, ckpt_a, other)
    with pytest.raises(LcftError) as e:  # eval's next step: the checkpoint is fixed, its data is not
        evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(other),), out=str(tmp_path / "out"), max_windows=1))
    assert str(e.value).endswith(f"prepare the held-out data with the checkpoint's tokenizer "
                                 f"(lcft prepare windows --tokenizer {other})"), e.value
    assert "start from a model" not in str(e.value)


def test_a_checkpoint_of_another_lcft_json_format_is_refused(data_dir, ckpt_a, tmp_path):
    """lcft.json of a format this lcft does not read (a newer lcft's): its fields may mean something else."""
    other = shutil.copytree(ckpt_a, tmp_path / "newer")
    meta = json.loads((other / "lcft.json").read_text())
    assert meta["format_version"] == 1  # what this lcft writes
    (other / "lcft.json").write_text(json.dumps({**meta, "format_version": 2}))
    _fails(tmp_path, r"lcft.json: format_version 2, this lcft reads 1", data_dir, other)


def test_transformers_folder_with_another_vocab_size(data_dir, tmp_path):
    ck = save_model(tmp_path / "v32", seed=0, vocab_size=32)
    (ck / "lcft.json").unlink()  # as transformers writes it: only config.json knows the vocabulary
    _fails(tmp_path, "vocab_size 32", data_dir, ck)


def test_empty_split(ckpt_a, tmp_path):
    data = tmp_path / "no-eval"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=WINDOW, train=("chr2",), eval=())
    _fails(tmp_path, "eval", data, ckpt_a)


def test_missing_data_folder(ckpt_a, tmp_path):
    _fails(tmp_path, "windows folder not found", tmp_path / "nope", ckpt_a)


def test_bad_max_context(data_dir, ckpt_a, tmp_path):
    _fails(tmp_path, "larger than the window", data_dir, ckpt_a, max_context=(2 * WINDOW,))


def test_a_sparse_model_takes_a_max_context_of_whole_blocks(data_dir, tmp_path):
    """The sparse kernels read whole blocks (a dense model takes any --max-context: test_evaluate)."""
    sparse = save_model(tmp_path / "sparse", seed=0, attention={"backend": "sparse", "block_size": 64})
    _fails(tmp_path, "--max-context 1000 is not a multiple of the attention block size 64", data_dir, sparse,
           max_context=(1000,))


def test_a_fault_of_lcft_while_a_checkpoint_loads_keeps_its_traceback(data_dir, ckpt_a, tmp_path, monkeypatch):
    """A readable checkpoint whose model lcft then fails to build (here: the model reader broken on purpose) is a
    bug of lcft, shown as itself, not a one-line "unreadable checkpoint" blaming the folder."""
    import lcft.checkpoint.reader as reader

    def broken(*args, **kwargs):
        raise RuntimeError("a contract of lcft's model code broken")

    monkeypatch.setattr(reader, "from_pretrained", broken)
    with pytest.raises(RuntimeError, match="contract of lcft"):
        evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a),), out=str(tmp_path / "r"), max_windows=1))
    assert not (tmp_path / "r" / JSON_NAME).exists()  # nothing written: the report is not complete


def test_unreadable_checkpoints(data_dir, ckpt_a, tmp_path):
    _fails(tmp_path, "checkpoint not found", data_dir, tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(tmp_path, "not a run folder", data_dir, empty)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    _fails(tmp_path, "no complete checkpoint", data_dir, run)
    truncated = shutil.copytree(ckpt_a, tmp_path / "truncated")
    w = truncated / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    _fails(tmp_path, "unreadable checkpoint .*truncated.*model.safetensors", data_dir, ckpt_a, truncated)
    no_weights = shutil.copytree(ckpt_a, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    _fails(tmp_path, "unreadable checkpoint .*no-weights: no model.safetensors", data_dir, no_weights)
    bad_json = shutil.copytree(ckpt_a, tmp_path / "bad-json")
    (bad_json / "config.json").write_text("{not json")
    _fails(tmp_path, "config.json", data_dir, bad_json)


@pytest.mark.parametrize("kw,match", [
    ({"labels": ("x", "y")}, "2 --label for 1"),
    ({"labels": ("",)}, "--label 1 of 1 is empty"),
    ({"labels": (" \t",)}, "--label 1 of 1 is empty"),
    ({"max_context": (0, 0)}, "2 --max-context for 1"),
    ({"bins": 0}, "bins"),
    ({"bins": 10**12}, r"--bins must be between 1 and 1,048,576, got 1000000000000"),  # edges bounded before any work
    ({"bootstrap": 10**12}, r"--bootstrap must be between 1 and 100,000 replicates"),  # before any checkpoint runs
])
def test_bad_options(data_dir, ckpt_a, tmp_path, kw, match):
    _fails(tmp_path, match, data_dir, ckpt_a, **kw)


def test_no_checkpoint(data_dir, tmp_path):
    _fails(tmp_path, "no checkpoint given", data_dir)


@pytest.mark.parametrize("device", ["meta", "mps", "xpu", "bogus", "cuda:128", "cuda:-1", 0])
def test_a_device_lcft_does_not_run_on(data_dir, ckpt_a, tmp_path, device):
    """torch names the first three; the model on them was a traceback (meta: 'unsupported scalarType'). torch
    reads cuda:128 as cuda:-128. Each is refused when the config is built, before a launch starts processes."""
    with pytest.raises(ConfigError, match=f"--device {device}: lcft evaluates on cpu or cuda"):
        EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a),), out=str(tmp_path / "out"), device=device)


def test_cuda_device_without_cuda(data_dir, ckpt_a, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    _fails(tmp_path, "CUDA is not available", data_dir, ckpt_a, device="cuda")


def test_a_report_inside_a_checkpoint_is_refused(data_dir, ckpt_a, tmp_path):
    """--out inside a checkpoint put the report among its files, where pruning the checkpoint (--keep-last)
    deletes it; refused as export refuses it. A run folder (the checkpoints' parent) stays a place for it."""
    ckpt = shutil.copytree(ckpt_a, tmp_path / "run" / "checkpoints" / "step-00000002")
    before = sorted(p.name for p in ckpt.iterdir())
    for out in (ckpt, ckpt / "eval"):
        with pytest.raises(LcftError, match=r"--out .* is the checkpoint .*, or inside it") as e:
            evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(tmp_path / "run"),), out=str(out),
                                max_windows=1))
        assert "\n" not in str(e.value) and sorted(p.name for p in ckpt.iterdir()) == before
    evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(tmp_path / "run"),), out=str(tmp_path / "run" / "eval"),
                        max_windows=1, bootstrap=10))
    assert (tmp_path / "run" / "eval" / "eval.json").is_file()


def test_a_char_checkpoint_on_kmer_data_names_the_tokenizer_that_prepares_its_data(ckpt_a, tmp_path):
    """A char checkpoint carries no tokenizer file, so `--tokenizer CHECKPOINT` is refused by prepare: the step
    named is `--tokenizer char`, and data prepared with it passes the checkpoint's tokenizer check."""
    kmer = tmp_path / "kmer2"
    prepare_windows(fasta=str(sample_fasta()), out=str(kmer), length=WINDOW, train=("chr2",), eval=("chr22",),
                    max_n_frac=0.6, tokenizer="kmer:2")
    with pytest.raises(LcftError) as e:
        evaluate(EvalConfig(data=str(kmer), checkpoints=(str(ckpt_a),), out=str(tmp_path / "out"), max_windows=1))
    assert str(e.value).endswith("(lcft prepare windows --tokenizer char)"), e.value
    with pytest.raises(LcftError, match="holds no tokenizer.json"):  # what the checkpoint folder itself gives
        prepare_windows(fasta=str(sample_fasta()), out=str(tmp_path / "ck"), length=WINDOW, train=("chr2",),
                        eval=("chr22",), max_n_frac=0.6, tokenizer=str(ckpt_a))
    char = tmp_path / "char"
    prepare_windows(fasta=str(sample_fasta()), out=str(char), length=WINDOW, train=("chr2",), eval=("chr22",),
                    max_n_frac=0.6, tokenizer="char")
    check_tokenizer(ckpt_a, json.loads((char / "manifest.json").read_text())["tokenizer"], EVAL_STEP)
