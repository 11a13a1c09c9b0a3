"""`lcft eval --position bases`: bins over base offsets. With char it equals --position tokens exactly; with
kmer:3 the binned sums equal a direct computation from plain logits + F.cross_entropy and ws.base_offsets."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.evaluate import EvalConfig, evaluate
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.model import Llama

from .conftest import small_config

KMER_WINDOW = 512  # tokens of 3 bases: 1536 bases per window


def _cfg(data: Path, out: Path, *ckpts: Path, **kw) -> EvalConfig:
    return EvalConfig(data=str(data), checkpoints=tuple(str(c) for c in ckpts), out=str(out), **kw)


def _figures(report: dict) -> list[dict]:
    """The per-checkpoint figures (options, creation time and the position unit aside)."""
    return report["checkpoints"]


def test_char_bases_equal_tokens_exactly(data_dir, ckpt_a, ckpt_b, tmp_path):
    kw = dict(bins=8, max_windows=3, batch_size=3, bootstrap=200, probe="copy", probe_segment=256, probe_windows=2)
    tokens = evaluate(_cfg(data_dir, tmp_path / "t", ckpt_a, ckpt_b, **kw))
    bases = evaluate(_cfg(data_dir, tmp_path / "b", ckpt_a, ckpt_b, position="bases", **kw))
    assert bases["positions"]["unit"] == "bases" and tokens["positions"]["unit"] == "tokens"
    assert bases["positions"]["edges"] == tokens["positions"]["edges"]
    for t, b in zip(_figures(tokens), _figures(bases), strict=True):
        assert b["bins"].pop("bases") == b["bins"]["tokens"]  # one base per char token
        assert b == t
    assert bases["checkpoints"][1]["probe"]["drop"] == tokens["checkpoints"][1]["probe"]["drop"]
    assert bases["checkpoints"][1]["trend"]["verdict"]  # the bootstrap trend is there


@pytest.fixture(scope="module")
def kmer_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kmer3") / "windows"
    prepare_windows(fasta=str(sample_fasta()), out=str(out), length=KMER_WINDOW, train=("chr2",), eval=("chr22",),
                    tokenizer="kmer:3", max_n_frac=0.6)
    return out


@pytest.fixture(scope="module")
def kmer_model(tmp_path_factory, kmer_data) -> Path:
    spec = open_windows(kmer_data, "eval").manifest["tokenizer"]
    torch.manual_seed(3)
    model = Llama(small_config(vocab_size=int(spec["vocab_size"])))
    with torch.no_grad():  # away from a uniform guess, so bins differ
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(5.0)
    out = tmp_path_factory.mktemp("kmer3-model") / "model"
    save_pretrained(model, out, tokenizer=spec)
    return out


def _token_recurrence(ws, i: int) -> np.ndarray:
    """(L,) per token: the direct nearest-copy distance of the k-mer ending at its last base."""
    from .test_recurrence import direct_distances

    d = direct_distances(ws.sequence(i))  # (bases,)
    return np.array([d[e - 1] for e in np.cumsum(ws.token_bases(i))])


def _direct(ws, model, n: int, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Per-bin nats, tokens, bases and repeat tokens over base offsets, from plain logits + cross-entropy."""
    k = len(edges) - 1
    out = {name: np.zeros(k) for name in ("nats", "tokens", "bases", "repeat", "recurring", "windows")}
    for i in range(n):
        ids = torch.from_numpy(np.asarray(ws[i], dtype=np.int64))[None]  # (1, L)
        with torch.no_grad():
            logits = model(ids)[0, :-1].double()  # (L-1, V)
        ce = F.cross_entropy(logits, ids[0, 1:], reduction="none").numpy()  # (L-1,) loss of token p = 1..L-1
        counted = ws.counted[ids[0, 1:].numpy()]  # (L-1,) tokens made only of A/C/G/T
        at = ws.base_offsets(i)[1:][counted]  # base offset of each counted predicted token
        b = np.searchsorted(edges, at, side="right") - 1  # (n_counted,) bin of each
        np.add.at(out["nats"], b, ce[counted])
        np.add.at(out["tokens"], b, 1)
        out["windows"][np.unique(b)] += 1  # the window has counted tokens in these bins
        np.add.at(out["bases"], b, ws.token_bases(i)[1:][counted])
        np.add.at(out["repeat"], b, ws.softmask(i)[1:][counted])
        np.add.at(out["recurring"], b, (_token_recurrence(ws, i) > 0)[1:][counted])
    return out


def test_kmer_bins_over_bases_equal_a_direct_computation(kmer_data, kmer_model, tmp_path):
    n = 3
    rep = evaluate(_cfg(kmer_data, tmp_path / "r", kmer_model, kmer_model, bins=6, max_windows=n, position="bases",
                        bootstrap=100))
    ws = open_windows(kmer_data, "eval")
    span = max(r["end"] - r["start"] for r in ws.records)
    edges = np.asarray(rep["positions"]["edges"])
    assert edges[-1] == span > KMER_WINDOW and rep["data"]["window_length"] == KMER_WINDOW
    d = _direct(ws, from_pretrained(kmer_model).eval(), n, edges)
    ck = rep["checkpoints"][0]
    b = ck["bins"]
    assert b["tokens"] == d["tokens"].astype(int).tolist() and b["bases"] == d["bases"].astype(int).tolist()
    assert rep["positions"]["windows"] == d["windows"].astype(int).tolist()
    np.testing.assert_allclose(b["loss"], d["nats"] / d["tokens"], rtol=1e-4)
    np.testing.assert_allclose(b["bits_per_base"], d["nats"] / d["bases"] / math.log(2), rtol=1e-4)
    assert ck["repeat"]["bins"]["tokens"] == d["repeat"].astype(int).tolist()
    assert ck["recurring"]["bins"]["tokens"] == d["recurring"].astype(int).tolist()
    assert ck["bases"] == int(d["bases"].sum()) and ck["tokens"] == int(d["tokens"].sum())
    assert ck["bits_per_base"] == pytest.approx(d["nats"].sum() / d["bases"].sum() / math.log(2), rel=1e-4)
    assert ck["bits_per_base"] == pytest.approx(sum(w["loss"] * w["tokens"] for w in ck["windows"])
                                                / ck["bases"] / math.log(2), rel=1e-9)
    same = rep["checkpoints"][1]  # the same weights again: zero change, a bootstrap interval of zero width
    assert same["relative_change"] == 0.0 and same["ci_low"] == same["ci_high"] == 0.0


def test_kmer_window_recurrence_equals_the_direct_computation_over_bases(kmer_data):
    from lcft.evaluate.split import recurrence_distances

    ws = open_windows(kmer_data, "eval")
    hits = 0
    for i in range(3):
        want = _token_recurrence(ws, i)  # (L,)
        assert recurrence_distances(ws, i).tolist() == want.tolist()
        hits += int((want > 0).sum())
    assert hits > 0


def test_kmer_subsets_by_token_position_give_bits_per_base(kmer_data, kmer_model, tmp_path):
    """--position tokens with 3-base tokens: every subset's bits per base is its nats over its tokens' bases."""
    n, names = 3, ("repeat", "unique", "recurring", "nonrecurring")
    rep = evaluate(_cfg(kmer_data, tmp_path / "r", kmer_model, bins=4, max_windows=n, bootstrap=20))
    assert rep["positions"]["unit"] == "tokens"
    assert "at least half" in rep["subsets"]["repeat"]  # what ws.softmask marks for a token of 3 bases
    ws, model = open_windows(kmer_data, "eval"), from_pretrained(kmer_model).eval()
    edges = np.asarray(rep["positions"]["edges"])
    k = len(edges) - 1
    nats, tokens, bases = ({s: np.zeros(k) for s in names} for _ in range(3))  # per subset, per bin
    for i in range(n):
        ids = torch.from_numpy(np.asarray(ws[i], dtype=np.int64))[None]  # (1, L)
        with torch.no_grad():
            logits = model(ids)[0, :-1].double()  # (L-1, V)
        ce = F.cross_entropy(logits, ids[0, 1:], reduction="none").numpy()  # (L-1,) loss of token p = 1..L-1
        counted = ws.counted[ids[0, 1:].numpy()]  # (L-1,)
        soft, again = ws.softmask(i)[1:].astype(bool), (_token_recurrence(ws, i) > 0)[1:]
        per = ws.token_bases(i)[1:]  # (L-1,) bases of each predicted token
        b = np.searchsorted(edges, np.arange(1, len(ce) + 1), side="right") - 1  # (L-1,) bin of token p
        for name, m in zip(names, (soft, ~soft, again, ~again), strict=True):
            m = m & counted
            np.add.at(nats[name], b[m], ce[m])
            np.add.at(tokens[name], b[m], 1)
            np.add.at(bases[name], b[m], per[m])
    ck, checked = rep["checkpoints"][0], 0
    for name in names:
        got = ck[name]
        assert got["tokens"] == tokens[name].sum() and got["bins"]["tokens"] == tokens[name].astype(int).tolist()
        if not tokens[name].sum():
            continue
        per_token = bases[name].sum() / tokens[name].sum()  # bases per token: about 3
        want = nats[name].sum() / tokens[name].sum() / math.log(2) / per_token
        assert per_token > 2 and got["bits_per_base"] == pytest.approx(want, rel=1e-4)
        with np.errstate(invalid="ignore"):  # a bin without tokens of the subset: NaN, null in the report
            by_bin = nats[name] / bases[name] / math.log(2)
        np.testing.assert_allclose(np.array(got["bins"]["bits_per_base"], dtype=float), by_bin, rtol=1e-4)
        checked += 1
    assert checked >= 3  # the sample's chr22 piece is upper case: no repeat tokens
