"""Which folder a --checkpoint means: a run (its latest checkpoint), a checkpoint, or a transformers folder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import lcft.evaluate.runner as runner
from lcft.checkpoint.layout import resolve_checkpoint
from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.checkpoints import default_labels
from tests.one_line import one_line

from .conftest import small_config


def test_run_folder_resolves_to_its_latest_complete_checkpoint(ckpt_a, ckpt_b, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ckpt_a, run / "checkpoints" / "step-00000002")
    shutil.copytree(ckpt_b, run / "checkpoints" / "step-00000010")
    shutil.copytree(ckpt_a, run / "checkpoints" / ".tmp-step-00000012")  # a save interrupted midway
    assert resolve_checkpoint(run) == run / "checkpoints" / "step-00000010"
    assert resolve_checkpoint(run / "checkpoints" / "step-00000002") == run / "checkpoints" / "step-00000002"


def test_a_folder_written_by_transformers_evaluates_like_ours(data_dir, ckpt_a, tmp_path):
    transformers = pytest.importorskip("transformers")
    c = small_config()
    hf_cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(hf_cfg)
    ours = transformers.LlamaForCausalLM.from_pretrained(ckpt_a)
    hf.load_state_dict(ours.state_dict())
    hf.to(torch.float32).save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf" / "lcft.json").exists()
    rep = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a), str(tmp_path / "hf")),
                              max_windows=2, out=str(tmp_path / "r")))
    a, b = rep["checkpoints"]
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_a_bf16_folder_is_evaluated_in_fp32_unless_asked_for_bf16(data_dir, ckpt_a, tmp_path):
    """Weights stored in bf16 are read into fp32: the default --precision fp32 computes in fp32, token for token
    the losses of the same bf16-rounded weights saved in fp32, not bf16 losses under an fp32 label."""
    import numpy as np

    from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
    from lcft.evaluate.checkpoints import CheckpointInfo, load_model
    from lcft.evaluate.losses import token_losses
    from lcft.genomics import open_windows

    save_pretrained(from_pretrained(ckpt_a), tmp_path / "bf16", dtype=torch.bfloat16)
    save_pretrained(from_pretrained(tmp_path / "bf16").float(), tmp_path / "fp32")  # the bf16 weights, upcast
    ids = torch.from_numpy(np.asarray(open_windows(data_dir, "eval")[0]).astype(np.int64))[None]  # (1, L)
    info = lambda name: CheckpointInfo(name, name, tmp_path / name, 0, {})  # noqa: E731
    models = [load_model(info(name), torch.device("cpu")) for name in ("fp32", "bf16")]
    assert all(p.dtype == torch.float32 for m in models for p in m.parameters())
    (want, _), (got, _) = (token_losses(m, ids) for m in models)
    assert torch.equal(got, want)
    (half, _) = token_losses(models[1], ids, precision="bf16")
    assert not torch.equal(half, want)  # bf16 only when asked for


def test_a_checkpoint_listed_twice_apart_is_loaded_once_and_reported_in_listed_order(data_dir, ckpt_a, ckpt_b,
                                                                                     tmp_path, monkeypatch):
    loads: list[str] = []
    real = runner.load_model

    def counting_load(info, device):
        loads.append(info.path.name)
        return real(info, device)

    monkeypatch.setattr(runner, "load_model", counting_load)
    rep = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a), str(ckpt_b), str(ckpt_a)),
                              labels=("a1", "b", "a2"), out=str(tmp_path / "r"), max_windows=2, bins=4,
                              probe="copy", probe_segment=128, probe_distances=(256,), probe_windows=1))
    assert loads == ["model-a", "model-b"]  # A once, though B comes between its two entries
    a1, b, a2 = rep["checkpoints"]
    assert [c["label"] for c in (a1, b, a2)] == ["a1", "b", "a2"]
    assert a1["weights_sha256"] == a2["weights_sha256"] != b["weights_sha256"]
    for key in ("loss", "bins", "probe"):  # A's figures in places 1 and 3, B's in place 2
        if key == "bins":  # but the reference's change against itself has no interval (null), a2's is [0, 0]
            assert a1[key]["ci_low"] == a1[key]["ci_high"] == [None] * 4 and a2[key]["ci_low"] == [0.0] * 4
            assert {k: v for k, v in a1[key].items() if not k.startswith("ci_")} == \
                {k: v for k, v in a2[key].items() if not k.startswith("ci_")}
        else:
            assert a1[key] == a2[key]
    assert a1["loss"] != b["loss"] and a1["probe"]["drop"] != b["probe"]["drop"]
    assert [w["loss"] for w in a1["windows"]] == [w["loss"] for w in a2["windows"]] != [w["loss"] for w in b["windows"]]


def test_a_checkpoint_listed_twice_says_its_losses_are_reused_not_resumed(data_dir, ckpt_a, tmp_path, capsys):
    """The second entry of the same weights and options reads back the first's losses: it said `resuming, 2 of 2
    read back from an interrupted run` in a run nothing had interrupted."""
    rep = evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a), str(ckpt_a)), out=str(tmp_path / "r"),
                              max_windows=2, probe="copy", probe_segment=128, probe_distances=(256,), probe_windows=1))
    first, second = rep["checkpoints"]
    assert (first["label"], second["label"]) == ("model-a#1", "model-a#2") and first["loss"] == second["loss"]
    said = capsys.readouterr().err.splitlines()
    assert said == ["model-a#2: the same weights and options as model-a#1: its losses reused",
                    "model-a#2: copy probe: the same weights and options as model-a#1: its losses reused"]


def test_default_labels_are_folder_names_made_unique():
    assert default_labels(["runs/base", "runs/long", "runs/long"], [0, 0, 1024]) == ["base", "long", "long@1K"]
    assert default_labels(["a/x", "b/x"], [0, 0]) == ["x#1", "x#2"]


@pytest.mark.parametrize("text, recorded", [
    ("when = 1979-05-27T07:32:00Z\nday = 1979-05-27\n", {"when": "1979-05-27 07:32:00+00:00", "day": "1979-05-27"}),
    ("lr = nan\nsteps = inf\nseq_len = 512\n", {"lr": "nan", "steps": "inf", "seq_len": 512}),
    ("x = " + "[" * 3000 + "]" * 3000 + "\n", {}),  # deeper than lcft reads: tomllib's recursion ran out
    ("not = toml = at all\n", {}),
])
def test_a_checkpoints_run_config_is_recorded_as_json_whatever_it_holds(data_dir, ckpt_a, tmp_path, text, recorded):
    """The config.toml beside a checkpoint is informational: the report records it as JSON takes it. A TOML date
    or a nan in it failed the report after every checkpoint was evaluated (json.dump); a deep one was a
    RecursionError."""
    ckpt = tmp_path / "m"
    shutil.copytree(ckpt_a, ckpt)
    (ckpt / "config.toml").write_text(text)
    out = tmp_path / "rep"
    evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt),), max_windows=1, out=str(out)))
    report = json.loads((out / "eval.json").read_text())
    assert report["checkpoints"][0]["train_config"] == recorded


@pytest.mark.parametrize("attention", [[1], {"backend": "sparse", "block_size": "x"}, {"block_size": 10**30},
                                       {"backend": "sparse", "top_k": 1.5}, {"backend": "sparse", "local_blocks": 10**12},
                                       {"backend": "sparse", "block_size": 96}])  # 2K windows: not whole blocks
def test_a_checkpoints_attention_record_of_other_kinds_is_one_line(data_dir, ckpt_a, tmp_path, attention):
    """eval reads the attention lcft.json records through the model's own reader, whose counts are whole and
    bounded (the raw record: an AttributeError, a ValueError from the kernel, a TypeError from torch.full)."""
    ckpt = tmp_path / "m"
    shutil.copytree(ckpt_a, ckpt)
    meta = json.loads((ckpt / "lcft.json").read_text())
    (ckpt / "lcft.json").write_text(json.dumps({**meta, "attention": attention}))
    one_line(lambda: evaluate(EvalConfig(data=str(data_dir), checkpoints=(str(ckpt),), max_windows=1,
                                         out=str(tmp_path / "rep"))), str(ckpt))
    assert not (tmp_path / "rep").exists()
