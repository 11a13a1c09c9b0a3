"""Continued training of models transformers built: `--init <HF folder>` (bf16 on disk) for a Qwen3 and a Mixtral
(router loss on) trains fp32 weights, then `lcft export`; transformers loads the export as the same class, with the
generation settings the published folder's generation_config.json holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.cli.app import app
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, max_position_embeddings=4096)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                         "output_router_logits": True, "sliding_window": None}),
}

# generation settings of the authors' choosing, none of them transformers' defaults
GENERATION = dict(max_length=4096, do_sample=True, temperature=0.7, top_k=8, bos_token_id=1, eos_token_id=[2, 3],
                  pad_token_id=0)


def _with_generation(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with GENERATION as its generation config, which its save_pretrained writes to generation_config.json."""
    model.generation_config = transformers.GenerationConfig(**GENERATION)
    return model


def _carried(published: Path, *folders: Path | str) -> None:
    """Each of `folders` (checkpoints, then the export) holds `published`'s generation_config.json byte for byte;
    transformers reads GENERATION from the export, and a model loaded from it generates with it."""
    want = (published / "generation_config.json").read_bytes()
    for folder in folders:
        assert (Path(folder) / "generation_config.json").read_bytes() == want, folder
    assert (transformers.GenerationConfig.from_pretrained(folders[-1]).to_dict()
            == transformers.GenerationConfig(**GENERATION).to_dict())
    back = transformers.AutoModelForCausalLM.from_pretrained(folders[-1])
    assert {k: getattr(back.generation_config, k) for k in GENERATION} == GENERATION


@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_from_a_transformers_folder_then_export(tmp_path, base_cfg, family):
    cfg_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    published = _with_generation(getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**SHAPE, **extra)))
    published.to(torch.bfloat16).save_pretrained(tmp_path / "hf")  # as checkpoints are mostly published
    s = train(TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "init": str(tmp_path / "hf"), "steps": 2}))
    assert s["step"] == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in read_metrics(tmp_path / "run"))

    r = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "export" / "config.json").read_text())["architectures"] == [model_cls]
    _carried(tmp_path / "hf", s["checkpoint"], tmp_path / "export")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    assert type(back).__name__ == model_cls
    ours, init = from_pretrained(s["checkpoint"]).eval(), from_pretrained(tmp_path / "hf")
    assert init.embed_tokens.weight.dtype == torch.bfloat16 and ours.embed_tokens.weight.dtype == torch.float32
    assert not torch.equal(ours.embed_tokens.weight, init.embed_tokens.weight.float())  # it trained, fp32 master
    ids = torch.randint(4, 9, (1, 64))
    with torch.no_grad():
        assert (back(ids).logits - ours(ids)).abs().max().item() < 1e-4


def test_a_padded_vocabulary_trains_evaluates_and_exports_as_transformers_reads_it(tmp_path, base_cfg):
    """A published model whose embedding is padded past its tokenizer (METAGENE-1's 1,024 tokens, vocab_size 1088:
    models round theirs up to a multiple of 64) was refused ('vocab_size 1088 differs from the data tokenizer's
    1024'). It trains, resumes, evaluates and exports; the padded rows stay in the softmax, as in transformers."""
    import shutil

    import numpy as np

    from lcft.evaluate import EvalConfig, evaluate
    from lcft.genomics import open_windows, prepare_windows, sample_fasta
    from tests.conftest import SHARED_PUBLISHED

    if not (SHARED_PUBLISHED / "metagene-1").is_dir():
        pytest.skip(f"published model files not found at {SHARED_PUBLISHED}")
    hf, data = tmp_path / "hf", str(tmp_path / "data")
    shutil.copytree(SHARED_PUBLISHED / "metagene-1", hf)
    torch.manual_seed(0)
    padded = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SHAPE, "vocab_size": 1088}))
    _with_generation(padded).save_pretrained(hf)
    prepare_windows(fasta=str(sample_fasta()), out=data, length=512, train=("chr2",), eval=("chr22",),
                    tokenizer=str(hf))
    run = {**base_cfg, "data": data, "init": str(hf), "steps": 3, "stop_after": 2}
    first = train(TrainConfig(out=str(tmp_path / "run"), **run))["checkpoint"]
    s = train(TrainConfig(out=str(tmp_path / "run"), **{**run, "stop_after": None}, resume="auto"))
    assert s["step"] == 3

    rep = evaluate(EvalConfig(data=data, checkpoints=(str(hf), s["checkpoint"]), max_windows=2,
                              out=str(tmp_path / "eval")))
    published = transformers.LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    windows = open_windows(data, "eval")
    nats = count = 0.0
    for i in range(2):  # transformers' cross-entropy over all 1088 rows, at the tokens eval counts
        ids = torch.from_numpy(np.asarray(windows[i]).astype(np.int64))[None]  # (1, L)
        with torch.no_grad():
            logits = published(ids).logits[0, :-1].double()  # (L-1, 1088)
        keep = torch.as_tensor(np.asarray(windows.counted))[ids[0, 1:]]  # (L-1,)
        nats += torch.nn.functional.cross_entropy(logits[keep], ids[0, 1:][keep], reduction="sum").item()
        count += int(keep.sum())
    assert rep["checkpoints"][0]["loss"] == pytest.approx(nats / count, rel=1e-5)

    r = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "export" / "config.json").read_text())["vocab_size"] == 1088
    _carried(hf, first, s["checkpoint"], tmp_path / "export")  # the resumed run's checkpoint kept it
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    ids = torch.from_numpy(np.asarray(windows[0]).astype(np.int64))[None]  # (1, L)
    with torch.no_grad():
        assert (back(ids).logits - from_pretrained(s["checkpoint"]).eval()(ids)).abs().max().item() < 1e-4
