"""`evaluate` end to end on the bundled human sample: outputs, reductions, oracles for the per-token loss."""

from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.config_build import build
from lcft.config_toml import load_toml
from lcft.evaluate import EvalConfig, evaluate, token_losses
from lcft.genomics import open_windows
from lcft.genomics.tokenizer import N

from .conftest import WINDOW


def _cfg(data_dir, out, *ckpts, **kw) -> EvalConfig:
    return EvalConfig(data=str(data_dir), checkpoints=tuple(str(c) for c in ckpts), out=str(out), **kw)


def _oracle(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss from plain logits + F.cross_entropy; N targets ignored. Aligned to the predicted position."""
    logits = model(ids)  # (B, L, V)
    target = ids[:, 1:].clone()  # (B, L-1)
    target[target == N] = -100
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), target, ignore_index=-100, reduction="none")  # (B, L-1)
    loss = torch.zeros(ids.shape, dtype=torch.float32)
    loss[:, 1:] = ce
    counted = torch.zeros(ids.shape, dtype=torch.bool)
    counted[:, 1:] = target != -100
    return loss, counted


def test_eval_writes_all_outputs_and_the_figures_agree(data_dir, ckpt_a, ckpt_b, tmp_path):
    out = tmp_path / "report"
    rep = evaluate(_cfg(data_dir, out, ckpt_a, ckpt_b, labels=("a", "b"), bins=8, max_windows=5, batch_size=2))
    for name in ("eval.json", "loss_by_position.csv", "loss_by_position.png", "eval.toml"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    on_disk = json.loads((out / "eval.json").read_text())
    assert on_disk["checkpoints"][0]["loss"] == rep["checkpoints"][0]["loss"]
    assert on_disk["data"]["windows"] == 5 and on_disk["data"]["window_length"] == WINDOW
    rows = list(csv.DictReader((out / "loss_by_position.csv").open()))
    assert len(rows) == 2 * 5 * 8  # every checkpoint's bins: all tokens, repeats, unique, recurring, non-recurring
    for ck in on_disk["checkpoints"]:
        b = ck["bins"]
        # Token-count-weighted bin means and window means both give back the overall mean.
        assert sum(v * n for v, n in zip(b["loss"], b["tokens"], strict=True)) / sum(b["tokens"]) == pytest.approx(ck["loss"], rel=1e-12)
        w = ck["windows"]
        assert sum(x["loss"] * x["tokens"] for x in w) / sum(x["tokens"] for x in w) == pytest.approx(ck["loss"], rel=1e-12)
        assert sum(b["tokens"]) == ck["tokens"] == sum(x["tokens"] for x in w)
        assert ck["bits_per_base"] == pytest.approx(ck["loss"] / math.log(2))
        assert len(ck["weights_sha256"]) == 64 and ck["config"]["hidden_size"] == 64
        assert ck["lcft"]["tokenizer"] == on_disk["data"]["tokenizer"]
        mine = [r for r in rows if r["label"] == ck["label"] and r["subset"] == "all"]
        assert [float(r["loss_nats_per_token"]) for r in mine] == b["loss"]
        assert [int(r["tokens"]) for r in mine] == b["tokens"]
    ws = open_windows(data_dir, "eval")
    assert [(x["chrom"], x["start"], x["end"]) for x in on_disk["checkpoints"][1]["windows"]] == [ws.coords(i) for i in range(5)]
    assert on_disk["checkpoints"][0]["weights_sha256"] != on_disk["checkpoints"][1]["weights_sha256"]
    # The saved config loads back into the same options.
    again = build(EvalConfig, load_toml(out / "eval.toml"))
    assert again == _cfg(data_dir, out, ckpt_a, ckpt_b, labels=("a", "b"), bins=8, max_windows=5, batch_size=2)
    import matplotlib.image as mpimg

    img = mpimg.imread(out / "loss_by_position.png")
    assert img.shape[0] > 300 and len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 10


def test_identical_checkpoints_give_zero_relative_change(data_dir, ckpt_a, tmp_path):
    copy = shutil.copytree(ckpt_a, tmp_path / "copy-of-a")  # loaded separately: a real second evaluation
    rep = evaluate(_cfg(data_dir, tmp_path / "r", ckpt_a, copy, bins=16, bin_scale="log", max_windows=3))
    a, b = rep["checkpoints"]
    assert a["weights_sha256"] == b["weights_sha256"]
    assert b["relative_change"] == 0.0 and all(v == 0.0 for v in b["bins"]["relative_change"])
    assert a["bins"]["loss"] == b["bins"]["loss"]


def test_per_token_losses_equal_a_plain_forward_pass(data_dir, ckpt_a):
    model = from_pretrained(ckpt_a).eval()
    ws = open_windows(data_dir, "eval")
    with_n = [i for i in range(len(ws)) if (np.asarray(ws[i]) == N).any()]
    assert with_n, "the fixture keeps windows at the edge of chr22's N gap"
    ids = torch.from_numpy(np.stack([ws[0], ws[with_n[0]]]).astype(np.int64))  # (2, L)
    loss, counted = token_losses(model, ids)
    with torch.no_grad():
        ref, ref_counted = _oracle(model, ids)
    assert torch.equal(counted, ref_counted) and not counted[:, 0].any()
    assert (~counted[1]).sum() > 100  # N targets are not counted
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert (loss[~counted] == 0).all()


def test_per_token_losses_equal_transformers(data_dir, ckpt_a):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(ckpt_a).eval()
    ws = open_windows(data_dir, "eval")
    ids = torch.from_numpy(np.asarray(ws[1]).astype(np.int64))[None]  # (1, L)
    loss, counted = token_losses(from_pretrained(ckpt_a).eval(), ids)
    with torch.no_grad():
        logits = hf(input_ids=ids).logits  # (1, L, V)
    ce = F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")  # (L-1,)
    torch.testing.assert_close(loss[0, 1:], ce, rtol=1e-4, atol=1e-4)


def test_report_window_loss_equals_the_oracle_mean(data_dir, ckpt_b, tmp_path):
    rep = evaluate(_cfg(data_dir, tmp_path / "r", ckpt_b, max_windows=2))
    model = from_pretrained(ckpt_b).eval()
    ws = open_windows(data_dir, "eval")
    for i in range(2):
        with torch.no_grad():
            ref, counted = _oracle(model, torch.from_numpy(np.asarray(ws[i]).astype(np.int64))[None])
        assert rep["checkpoints"][0]["windows"][i]["loss"] == pytest.approx(ref[counted].double().mean().item(), rel=1e-5)


def test_max_context_equal_to_the_window_changes_nothing(data_dir, ckpt_a, tmp_path):
    copy = shutil.copytree(ckpt_a, tmp_path / "a2")
    rep = evaluate(_cfg(data_dir, tmp_path / "r", ckpt_a, copy, max_context=(0, WINDOW), max_windows=3))
    a, b = rep["checkpoints"]
    assert b["max_context"] == WINDOW
    for key in ("loss", "first_tenth_loss", "last_tenth_loss", "tokens"):
        assert a[key] == b[key]
    figures = lambda ck: {k: v for k, v in ck["bins"].items() if not k.startswith("ci_")}  # noqa: E731
    assert figures(a) == figures(b) and [w["loss"] for w in a["windows"]] == [w["loss"] for w in b["windows"]]
    assert set(b["bins"]["ci_low"] + b["bins"]["ci_high"]) == {0.0}  # the same losses: 0 in every replicate
    assert set(a["bins"]["ci_low"] + a["bins"]["ci_high"]) == {None}  # the reference has no interval


def test_max_context_cuts_the_window_into_independent_pieces(data_dir, ckpt_a):
    model = from_pretrained(ckpt_a).eval()
    ws = open_windows(data_dir, "eval")
    ids = torch.from_numpy(np.stack([ws[2], ws[3]]).astype(np.int64))  # (2, L)
    c = 512
    loss, counted = token_losses(model, ids, max_context=c)
    full, _ = token_losses(model, ids)
    with torch.no_grad():
        for s in range(0, WINDOW, c):
            # The piece plus the next piece's first token, run on its own with positions from 0: causal, so
            # logits up to the piece's last token see only the piece (which is what the control gives them).
            ref, _ = _oracle(model, ids[:, s:s + c + 1])  # (2, C+1), or (2, C) for the last piece
            n = ref.shape[1]
            torch.testing.assert_close(loss[:, s + 1:s + n], ref[:, 1:], rtol=1e-5, atol=1e-5)
    assert torch.equal(loss[:, 1:c], full[:, 1:c])  # the first piece is the window's own start
    assert not torch.allclose(loss[:, c:], full[:, c:])  # later pieces lost their earlier context


def test_a_dense_model_takes_a_max_context_of_any_length(data_dir, ckpt_b, tmp_path):
    """Dense attention has no blocks: pieces of 1000 tokens (1000, 1000, 48 of a 2K window), each with the
    next piece's first token run on its own as a plain forward pass (as the test above)."""
    c = 1000
    rep = evaluate(_cfg(data_dir, tmp_path / "r", ckpt_b, max_context=(c,), max_windows=1))
    model = from_pretrained(ckpt_b).eval()
    ids = torch.from_numpy(np.asarray(open_windows(data_dir, "eval")[0]).astype(np.int64))[None]  # (1, L)
    ref, counted = torch.zeros(ids.shape), torch.zeros(ids.shape, dtype=torch.bool)  # (1, L) each
    with torch.no_grad():
        for s in range(0, WINDOW, c):
            loss, seen = _oracle(model, ids[:, s:s + c + 1])  # (1, C+1), or shorter for the last piece
            ref[:, s + 1:s + loss.shape[1]], counted[:, s + 1:s + loss.shape[1]] = loss[:, 1:], seen[:, 1:]
    assert rep["checkpoints"][0]["windows"][0]["loss"] == pytest.approx(ref[counted].double().mean().item(), rel=1e-5)


def test_bf16_losses_stay_close_to_fp32(data_dir, ckpt_a):
    model = from_pretrained(ckpt_a).eval()
    ids = torch.from_numpy(np.asarray(open_windows(data_dir, "eval")[0]).astype(np.int64))[None]  # (1, L)
    full, counted = token_losses(model, ids)
    half, _ = token_losses(model, ids, precision="bf16")
    assert half.dtype == torch.float32
    assert abs(half[counted].mean().item() - full[counted].mean().item()) < 1e-2 * full[counted].mean().item()


def test_the_loss_at_position_p_sees_exactly_the_p_tokens_before_it(data_dir, ckpt_a):
    """A forward over the prefix ids[:p] alone predicts token p as the window's loss does: no later token leaks
    in, and no earlier one is left out (position 0, with no context, carries no loss)."""
    model = from_pretrained(ckpt_a).eval()
    ids = torch.from_numpy(np.asarray(open_windows(data_dir, "eval")[0]).astype(np.int64))[None]  # (1, L)
    loss, counted = token_losses(model, ids)
    assert not counted[0, 0] and loss[0, 0] == 0
    for p in (1, 2, 17, 640, WINDOW - 1):
        with torch.no_grad():
            logits = model(ids[:, :p])[0, -1]  # (V,) from the p tokens before position p
        want = F.cross_entropy(logits[None], ids[0, p:p + 1])
        assert counted[0, p] and loss[0, p].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


def test_an_earlier_report_in_out_is_named_before_it_is_replaced(data_dir, ckpt_a, ckpt_b, tmp_path, capfd):
    """Another checkpoint evaluated into an --out that holds a report (the default reports/eval, run after run)
    replaced that report when it ended, without a word; now one line before any pass names the report it will
    replace. The same inputs again read the report back (nothing replaced, nothing said); none there: nothing."""
    out = tmp_path / "report"
    evaluate(_cfg(data_dir, out, ckpt_a, labels=("first",), bins=4, max_windows=2))
    assert "earlier evaluation" not in capfd.readouterr().err
    evaluate(_cfg(data_dir, out, ckpt_a, labels=("first",), bins=4, max_windows=2))
    assert "earlier evaluation" not in capfd.readouterr().err
    evaluate(_cfg(data_dir, out, ckpt_b, labels=("second",), bins=4, max_windows=2))
    said = [line for line in capfd.readouterr().err.splitlines() if "earlier evaluation" in line]
    assert said == [f"{out} holds an earlier evaluation's report (first): this evaluation replaces it when it ends; "
                    "stop it now and choose another --out to keep that one"], said
    assert [ck["label"] for ck in json.loads((out / "eval.json").read_text())["checkpoints"]] == ["second"]
