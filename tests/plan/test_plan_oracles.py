"""`lcft plan` against oracles outside it: transformers' own model for the parameter count of every family lcft
trains (biases, tied and untied heads, GQA, q/k norms, experts) and of the published genome models' configs, the
trainer's length check, the data's vocabulary for a preset, and the K/V streaming's own piece count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import read_config
from lcft.cli.app import app
from lcft.model import preset
from lcft.parallel.cp_stream import piece_count
from lcft.plan.estimate import Layout, kv_bytes
from lcft.plan.shape import Shape
from tests.conftest import SHARED_PUBLISHED as PUBLISHED

transformers = pytest.importorskip("transformers")
runner = CliRunner()

SMALL = {"vocab_size": 4128, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 2}
FAMILIES = {  # config.json as a user hands it to `lcft plan --init`
    "llama-attention-bias": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": True},
    "llama-tied": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": True},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3-attention-bias": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 64,
                             "attention_bias": True},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "head_dim": 48},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                "num_experts_per_tok": 2},
}


def transformers_count(config: dict) -> int:
    """Parameters of the model transformers builds from `config` (on the meta device: no memory, no init)."""
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "auto_map"})
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf).num_parameters()


def planned_count(config: dict, folder: Path) -> int:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return Shape.of(read_config(folder)).params


@pytest.mark.parametrize("name", list(FAMILIES))
def test_parameter_count_matches_transformers(name: str, tmp_path: Path) -> None:
    """Biases were left out of the count (every Qwen2 has q/k/v biases; Llama and Qwen3 with attention_bias put
    one on o_proj too): `lcft plan` printed fewer parameters than the model it plans has."""
    config = {**SMALL, **FAMILIES[name]}
    assert planned_count(config, tmp_path / "m") == transformers_count(config)


@pytest.mark.parametrize("name", ["generator-eukaryote-3b-base", "metagene-1"])
def test_published_parameter_counts_match_transformers(name: str, tmp_path: Path) -> None:
    folder = PUBLISHED / name
    if not folder.is_dir():
        pytest.skip(f"published model files not found at {PUBLISHED}")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]  # GENERator's own class is its model_type's (llama)
    assert Shape.of(read_config(folder)).params == transformers_count(config)


@pytest.mark.parametrize("args,needle", [
    (["--attention", "sparse", "--seq-len", "4097"], "--seq-len 4097 is not a multiple of the sparse attention "
                                                     "block size 64"),
    (["--attention", "sparse", "--block-size", "3", "--seq-len", "4K"], "--seq-len 4096 is not a multiple of the "
                                                                        "sparse attention block size 3"),
])
def test_a_length_train_refuses_is_refused_by_plan(args: list[str], needle: str) -> None:
    """Sparse attention takes whole blocks (lcft.shapes.check_length, as the trainer checks it): the plan said
    "fits" for a length `lcft train` then refused."""
    r = runner.invoke(app, ["plan", "--preset", "tiny", *args])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [f"error: {needle}"], r.output


def test_a_length_longer_than_the_datas_windows_is_refused(tmp_path: Path) -> None:
    """--data with a longer --seq-len: `lcft train` refuses it; the plan read the data only for the default."""
    from lcft.genomics import prepare_windows, sample_fasta

    data = tmp_path / "w"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=1024, train=("chr22",), eval=())
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--data", str(data), "--seq-len", "2K"])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [
        "error: --seq-len 2048 is longer than the data's windows (1024 tokens); prepare longer windows or use a "
        "shorter --seq-len"], r.output
    assert runner.invoke(app, ["plan", "--preset", "tiny", "--data", str(data)]).exit_code == 0


@pytest.mark.parametrize("blocks_per_chunk, pieces", [(4, 8), (5, 5), (11, 2)])
def test_streamed_kv_uses_the_streams_piece_count(blocks_per_chunk: int, pieces: int) -> None:
    """--cp-kv stream sends the largest piece count up to 8 that divides a rank's key blocks (8 of 8 blocks, 5 of
    10, 2 of 22): the plan assumed 8 whenever there were 8 blocks, a quarter of the K/V for 22 blocks."""
    model = preset("1b")
    block, cp = model.attention.sparse.block_size, 4
    seq = 2 * cp * block * blocks_per_chunk
    lay = Layout(seq, world=cp, cp=cp, cp_kv="stream", checkpointing="block")
    shape = Shape.of(model)
    assert piece_count(seq // cp // block) == pieces  # the stream's own count, as cp_stream cuts it
    remote = (cp - 1) * (seq // cp) // pieces
    assert kv_bytes(shape, lay) == 2 * 2 * remote * shape.kv_width * 2


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_mixture_of_experts_saved_activations_match_autograd(precision: str) -> None:
    """A Mixtral block saves, per routed expert and token, besides the SwiGLU's 4I: the expert's gathered input
    (fp32, or its two bf16 casts), its output and the router-weighted output (fp32); under bf16 autocast every
    expert's gate, up and down weights are cast copies, none in fp32 (the experts are not fused). The plan had
    0.84 (fp32) and 0.71 (bf16) of what autograd saves here: planned 'activations held' + weight copies against
    the bytes of every storage a real forward saves (as tests/plan/test_plan.py checks dense blocks)."""
    from lcft.model import Llama, LlamaConfig
    from lcft.plan.estimate import estimate
    from lcft.train.step import LossModel

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, model_type="mixtral")
    torch.manual_seed(0)
    lm = LossModel(Llama(cfg), 1e-4, 8192)
    weights = {p.untyped_storage().data_ptr() for p in lm.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(4, 8, (1, 512))  # (1, L)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        lm(ids, ids)
    est = estimate(cfg, Layout(512, precision=precision, device="cpu"))
    ratio = (est.activations + est.weight_copies) / sum(storages.values())
    assert abs(ratio - 1) < 0.10, ratio


def test_a_preset_is_planned_over_the_datas_vocabulary(tmp_path: Path) -> None:
    """Windows of a 65,536-token vocabulary: `lcft train` gives a fresh preset model an embedding and a head of
    that many rows. The plan kept the preset's 16 (a tiny model over a 4M vocabulary "fits" in 1.31 GiB, then
    ran out of memory in train, which named `lcft plan`); it counts transformers' model of that vocabulary."""
    from lcft.genomics import prepare_windows, sample_fasta
    from lcft.model.hf import config_to_hf

    n = 1 << 16
    (tmp_path / "vocab.txt").write_text("\n".join(["<unk>", *"ACGTN", *(f"x{i}" for i in range(6, n))]) + "\n")
    data = tmp_path / "w"
    prepare_windows(fasta=str(sample_fasta()), out=str(data), length=1024, train=("chr22",), eval=(),
                    tokenizer=f"kmer:1:{tmp_path / 'vocab.txt'}")
    count = transformers_count({**config_to_hf(preset("tiny")), "vocab_size": n})
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--data", str(data), "--explain"])
    assert r.exit_code == 0 and f"P = {count:,} (fp32 master weights)" in r.output, r.output
