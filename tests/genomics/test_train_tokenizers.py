"""End to end with a model's own BPE: an HF Llama and its tokenizer built by transformers -> prepare -> train 3
steps -> eval; lcft's held-out per-token loss equals transformers' on the same windows, bits per base = total
nats / bases / ln 2; a model of another tokenizer is refused; export carries the tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, trainers

from lcft.errors import LcftError
from lcft.genomics import open_windows, prepare_windows, sample_fasta
from tests.genomics.conftest import bio_records

transformers = pytest.importorskip("transformers")
WINDOW, SEQ = 1024, 512


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A small LlamaForCausalLM with a BPE of 300 trained on the sample, saved with its tokenizer by transformers."""
    seq = bio_records(sample_fasta())["chr2"].upper()
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.train_from_iterator((seq[i : i + 1000] for i in range(0, 600_000, 1000)),
                           trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<unk>"], show_progress=False))
    out = tmp_path_factory.mktemp("hf") / "bpe-llama"
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(str(out))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                   rope_theta=1e6, max_position_embeddings=4096)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(out))
    return out


def test_prepare_train_eval_with_the_models_bpe(hf_model, tmp_path):
    from lcft.evaluate import EvalConfig, evaluate
    from lcft.train import TrainConfig, train

    data = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=WINDOW, train="chr2", eval="chr22",
                    tokenizer=str(hf_model))
    s = train(TrainConfig(data=str(data), init=str(hf_model), out=str(tmp_path / "run"), seq_len=SEQ, steps=3,
                          global_batch=2, micro_batch=1, warmup=1, lr=1e-3, precision="fp32", save_every=0,
                          progress=False))
    report = evaluate(EvalConfig(data=str(data), checkpoints=(str(s["checkpoint"]),), out=str(tmp_path / "rep"),
                                 max_windows=2))
    ck = report["checkpoints"][0]
    ws = open_windows(data, "eval")
    model = transformers.LlamaForCausalLM.from_pretrained(str(s["checkpoint"])).eval()
    nats = tokens = bases = 0.0
    for i in range(2):
        ids = torch.from_numpy(np.asarray(ws[i], dtype=np.int64))[None]  # (1, L)
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].double()  # (L-1, V) predicts tokens 1..L-1
        nxt = ids[0, 1:]
        counted = torch.from_numpy(ws.counted[nxt.numpy()])  # (L-1,) tokens made only of A/C/G/T
        ce = torch.nn.functional.cross_entropy(logits, nxt, reduction="none")[counted]
        nats += float(ce.sum())
        tokens += int(counted.sum())
        bases += float(ws.token_bases(i)[1:][counted.numpy()].sum())
    assert ck["tokens"] == tokens
    assert ck["loss"] == pytest.approx(nats / tokens, abs=1e-4)
    assert ck["bits_per_base"] == pytest.approx(nats / bases / math.log(2), abs=1e-4)
    assert ck["bits_per_base"] < ck["loss"] / math.log(2)  # a BPE token holds several bases


def test_model_of_another_tokenizer_is_refused(hf_model, tmp_path):
    from lcft.train import TrainConfig, train

    data = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=WINDOW, train="chr2", eval=(), tokenizer="kmer:4")
    with pytest.raises(LcftError, match="different tokenizer") as e:
        train(TrainConfig(data=str(data), init=str(hf_model), out=str(tmp_path / "run"), seq_len=SEQ, steps=1,
                          global_batch=1, micro_batch=1, precision="fp32", save_every=0, progress=False))
    assert "\n" not in str(e.value) and "kmer:4" in str(e.value) and "bpe" in str(e.value)
    assert not (tmp_path / "run").exists()


def test_fresh_preset_with_kmers_then_export_carries_the_tokenizer(tmp_path):
    """A fresh preset takes the data's vocabulary; `lcft export` writes tokenizer files that AutoTokenizer loads
    and that encode a window's bases to the ids lcft trained on."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from lcft.train import TrainConfig, train

    data = tmp_path / "data"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=WINDOW, train="chr2", eval="chr22",
                    tokenizer="kmer:4")
    s = train(TrainConfig(data=str(data), preset="tiny", out=str(tmp_path / "run"), seq_len=SEQ, steps=1,
                          global_batch=1, micro_batch=1, precision="fp32", save_every=0, progress=False))
    ckpt = Path(s["checkpoint"])
    assert json.loads((ckpt / "config.json").read_text())["vocab_size"] == 4 + 5 + 1 + 4**4
    out = tmp_path / "export"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "lcft", "export", str(ckpt), "--out", str(out)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    ws = open_windows(data, "eval")
    assert auto(ws.sequence(0), add_special_tokens=False)["input_ids"] == ws[0].tolist()
    assert json.loads((out / "lcft.json").read_text())["tokenizer"] == ws.manifest["tokenizer"]
