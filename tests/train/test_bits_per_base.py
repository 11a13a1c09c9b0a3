"""Train's bits per base are the step's nats over the bases its counted tokens cover: a 6-mer model's train
figure equals `lcft eval`'s on the same weights and windows (one step over every window, a learning rate too
small to move the weights), not nats per token / ln 2 (six times larger). The figure is the model's plain
cross-entropy whatever the objective weighs in (soft-mask weights, z-loss)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate.terminal import table
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.model import Llama
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics

from .conftest import small_model_config

WINDOW = 256  # 6-mer tokens: 1536 bases a window


def test_train_bits_per_base_equal_eval_for_kmers(genomes_dir, tmp_path):
    data = tmp_path / "data"
    prepare_windows(fasta=str(genomes_dir / "lambda_phage_NC_001416.1.fa"), out=str(data), length=WINDOW,
                    train=("gi|9626243|ref|NC_001416.1|",), eval=(), tokenizer="kmer:6")
    ws = open_windows(data, "train")
    spec = ws.manifest["tokenizer"]
    torch.manual_seed(5)
    model = Llama(small_model_config(vocab_size=int(spec["vocab_size"])))
    with torch.no_grad():  # away from a uniform guess, so windows differ
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    save_pretrained(model, tmp_path / "init", tokenizer=spec)
    n = len(ws)
    s = train(TrainConfig(data=str(data), init=str(tmp_path / "init"), out=str(tmp_path / "run"), seq_len=WINDOW,
                          steps=1, global_batch=n, micro_batch=n, warmup=0, lr=1e-12, precision="fp32",
                          save_every=0, progress=False))
    rec = read_metrics(tmp_path / "run")[-1]
    rep = evaluate(EvalConfig(data=str(data), checkpoints=(s["checkpoint"],), out=str(tmp_path / "eval"),
                              split="train", bootstrap=10, bins=4))
    ck = rep["checkpoints"][0]
    assert ck["tokens"] > 0 and ck["bases"] == pytest.approx(6 * ck["tokens"], rel=0.01)
    assert rec["loss"] == pytest.approx(ck["loss"], rel=1e-3)  # nats per token, the same tokens
    assert rec["bits_per_base"] == pytest.approx(ck["bits_per_base"], rel=0.05)
    assert rec["bits_per_base"] == pytest.approx(rec["loss"] / 6 / math.log(2), rel=0.01)
    heads = [c.header for c in table(rep).columns]  # every column names its unit
    assert heads[1:4] + heads[5:] == ["context\ntokens", "loss\nnats/token", "loss\nbits/base", "first 10%\nnats/token",
                                      "last 10%\nnats/token", "last-first\nnats/token"], heads
    # A uniform guess over A, C, G, T is 2 bits per base: per 6-mer token that is the bases it covers x ln 4.
    assert rep["uniform"]["bits_per_base"] == 2.0
    assert rep["uniform"]["loss"] == pytest.approx(ck["bases"] / ck["tokens"] * math.log(4), rel=1e-12)
    assert rep["uniform"]["loss"] == pytest.approx(6 * math.log(4), rel=0.01)
    # Per-bin bits per base are over the bin's bases too (the bins' nats per token / ln 2 are per token).
    bins = ck["bins"]
    assert [b for b in bins["bits_per_base"]] == pytest.approx(
        [loss / 6 / math.log(2) for loss in bins["loss"]], rel=0.01)
    summary = json.loads((Path(s["run_dir"]) / "summary.json").read_text())
    assert summary["bits_per_base"] == rec["bits_per_base"] and summary["loss"] == rec["loss"]


def test_train_loss_is_the_plain_cross_entropy_under_softmask_weights_and_z_loss(tmp_path):
    """--softmask-loss-weight 0.1 and a z-loss shape the objective only: the step's logged loss and bits per base
    are `lcft eval`'s on the same weights and windows (eval counts every token at full weight), not the weighted
    sum over the counted tokens (about half of it on these windows, a third of whose bases are soft-masked)."""
    data = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=512, stride=256 * 1024, train=("chr2",),
                    eval=())
    ws = open_windows(data, "train")
    n = len(ws)
    assert 0.1 < sum(ws.softmask(i).mean() for i in range(n)) / n < 0.9  # soft-masked bases are there to weigh
    torch.manual_seed(5)
    model = Llama(small_model_config())
    with torch.no_grad():  # away from a uniform guess, so soft-masked and plain bases differ in loss
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    save_pretrained(model, tmp_path / "init")
    s = train(TrainConfig(data=str(data), init=str(tmp_path / "init"), out=str(tmp_path / "run"), seq_len=512,
                          steps=1, global_batch=n, micro_batch=n, warmup=0, lr=1e-12, precision="fp32",
                          softmask_loss_weight=0.1, z_loss=1e-2, save_every=0, progress=False))
    rec = read_metrics(tmp_path / "run")[-1]
    rep = evaluate(EvalConfig(data=str(data), checkpoints=(s["checkpoint"],), out=str(tmp_path / "eval"),
                              split="train", bootstrap=10, bins=4))
    ck = rep["checkpoints"][0]
    assert rec["loss"] == pytest.approx(ck["loss"], rel=1e-3)
    assert rec["bits_per_base"] == pytest.approx(ck["bits_per_base"], rel=1e-3)
    assert s["loss"] == rec["loss"]
