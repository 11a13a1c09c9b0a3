"""lcft.checkpoint.layout: which folder a path means (run -> latest checkpoint), resume lookup, and the tokenizer check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcft.checkpoint.layout import (
    check_tokenizer,
    latest_checkpoint,
    list_checkpoints,
    locate_checkpoint,
    resolve_checkpoint,
    resolve_resume,
)
from lcft.checkpoint.save import write_checksums
from lcft.errors import LcftError
from lcft.genomics.tokenizer import tokenizer_spec
from tests.one_line import one_line


def model_folder(p: Path, vocab_size: int = 16, tokenizer: dict | None = None, state: bool = False) -> Path:
    """A folder with config.json (and lcft.json when a tokenizer is given): what the layout checks read."""
    p.mkdir(parents=True)
    (p / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    if tokenizer is not None:
        (p / "lcft.json").write_text(json.dumps({"tokenizer": tokenizer}))
    if state:
        (p / "trainer_state").mkdir()
    return p


def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for step in (2, 10, 9):
        model_folder(run / "checkpoints" / f"step-{step:08d}", state=True)
    model_folder(run / "checkpoints" / ".tmp-step-00000012")  # a save cut short: not a checkpoint
    model_folder(run / "checkpoints" / "step-99")  # not a name the trainer writes
    return run


def test_run_folder_means_its_highest_complete_step(tmp_path):
    run = make_run(tmp_path)
    ckpts = run / "checkpoints"
    assert [s for s, _ in list_checkpoints(run)] == [2, 9, 10]
    assert latest_checkpoint(run) == resolve_checkpoint(run) == ckpts / "step-00000010"
    assert resolve_checkpoint(ckpts / "step-00000002") == ckpts / "step-00000002"
    hf = model_folder(tmp_path / "hf")  # a folder transformers wrote
    assert resolve_checkpoint(hf) == hf
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_resolve_checkpoint_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
    for name, message in (("nope", "checkpoint not found"), ("file", "must be a folder"),
                          ("empty", "not a run folder"), ("fresh", "no complete checkpoint")):
        with pytest.raises(LcftError, match=message):
            resolve_checkpoint(tmp_path / name)


def test_resume_lookup(tmp_path):
    run = make_run(tmp_path)
    ckpts = run / "checkpoints"
    assert resolve_resume("auto", run) == ckpts / "step-00000010"
    assert resolve_resume(str(run), tmp_path / "other") == ckpts / "step-00000010"
    assert resolve_resume(str(ckpts / "step-00000009"), run) == ckpts / "step-00000009"
    with pytest.raises(LcftError, match="no checkpoint in"):
        resolve_resume("auto", tmp_path / "other")
    with pytest.raises(LcftError, match="not a checkpoint folder"):
        resolve_resume(str(model_folder(tmp_path / "hf")), run)  # no trainer state to resume


def test_tokenizer_check_needs_equal_spec_and_a_vocab_size_holding_the_data(tmp_path):
    data = tokenizer_spec()
    check_tokenizer(model_folder(tmp_path / "ours", tokenizer=data), data)
    check_tokenizer(model_folder(tmp_path / "hf"), data)  # no lcft.json: config.json's vocab_size decides
    other = {**data, "name": "dna-kmer3", "vocab_size": 80}
    with pytest.raises(LcftError, match="different tokenizer"):
        check_tokenizer(model_folder(tmp_path / "kmer", vocab_size=80, tokenizer=other), data)
    # the recorded spec matches and the embedding has more rows: a padded one, as published models round theirs up
    check_tokenizer(model_folder(tmp_path / "padded", vocab_size=32, tokenizer=data), data)
    # the recorded spec matches but the embedding was shrunk: the data's ids past its rows cannot be read
    with pytest.raises(LcftError, match=f"vocab_size 8 differs from the data tokenizer's {data['vocab_size']} "
                                        r"\(the data's vocabulary is larger"):
        check_tokenizer(model_folder(tmp_path / "shrunk", vocab_size=8, tokenizer=data), data)
    # no tokenizer recorded: the size is all there is to compare, and another one may be another vocabulary
    with pytest.raises(LcftError, match="vocab_size 32"):
        check_tokenizer(model_folder(tmp_path / "hf32", vocab_size=32), data)
    (tmp_path / "ours" / "lcft.json").write_text("{cut")
    with pytest.raises(LcftError, match="lcft.json: not valid JSON"):
        check_tokenizer(tmp_path / "ours", data)


@pytest.mark.parametrize("change,difference", [
    ({"vocab": [*tokenizer_spec()["vocab"][:5], "X", *tokenizer_spec()["vocab"][6:]]}, "token 5 'X' vs 'C'"),
    ({"case_free": False}, "case_free False vs True"),
])
def test_tokenizer_mismatch_names_what_differs(tmp_path, change, difference):
    """Two specs of one name and size (the message said `dna-char with 16 tokens vs dna-char with 16 tokens`):
    the error names the first field or token in which they differ."""
    data = tokenizer_spec()
    ckpt = model_folder(tmp_path / "m", tokenizer={**data, **change})
    one_line(lambda: check_tokenizer(ckpt, data), "dna-char with 16 tokens vs dna-char with 16 tokens", difference)



def test_a_runs_checkpoints_folder_names_the_run_and_its_latest(tmp_path):
    run = make_run(tmp_path)
    one_line(lambda: resolve_checkpoint(run / "checkpoints"), f"give the run folder {run}",
             str(run / "checkpoints" / "step-00000010"))


@pytest.mark.parametrize("kind", ["link to nothing", "folder"])
def test_a_model_config_that_is_no_file_is_named(tmp_path, kind):
    """A model folder whose config.json is a link to nothing (a copy made without following links, a blob
    removed) or a folder: one line naming it; it was 'not a run folder, a checkpoint folder or an HF model folder
    (no config.json)', as if the file were missing."""
    model = tmp_path / "model"
    model.mkdir()
    if kind == "folder":
        (model / "config.json").mkdir()
    else:
        (model / "config.json").symlink_to(tmp_path / "gone.json")
    said = "a symbolic link to nothing" if kind != "folder" else "a folder"
    with pytest.raises(LcftError, match=f"^model config {model / 'config.json'} is {said}, not a regular file$"):
        locate_checkpoint(model)


def test_an_unfinished_save_named_directly_is_refused(tmp_path):
    """A `.tmp-step-N` (a save cut short, or one under way) named as the checkpoint to read, and a step-N without
    checksums.json in a run whose other checkpoints have one: one line each; both had been read unverified, so an
    export, eval or resume could take half-written weights."""
    run = make_run(tmp_path)
    ckpts = run / "checkpoints"
    cut = ckpts / ".tmp-step-00000012"
    with pytest.raises(LcftError, match=rf"^{cut} is not a finished checkpoint: .* give the run folder or a step-N$"):
        resolve_checkpoint(cut)
    cut_with_state = model_folder(ckpts / ".tmp-step-00000013", state=True)
    with pytest.raises(LcftError, match="is not a finished checkpoint"):
        resolve_resume(str(cut_with_state), run)
    assert resolve_checkpoint(ckpts / "step-00000009") == ckpts / "step-00000009"  # a run without checksums: as is
    write_checksums(ckpts / "step-00000002")
    one_line(lambda: resolve_checkpoint(ckpts / "step-00000009"),
             f"checkpoint {ckpts / 'step-00000009'} is incomplete: no checksums.json; the previous checkpoint is "
             f"{ckpts / 'step-00000002'}")
    assert resolve_checkpoint(ckpts / "step-00000002") == ckpts / "step-00000002"
    hf = model_folder(tmp_path / "hf")  # not in a run: nothing to compare with
    assert resolve_checkpoint(hf) == hf
