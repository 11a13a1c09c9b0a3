"""`--shard fsdp` through the trainer (torchrun, gloo, fp32) against one process: fsdp on 2 ranks, dp 2 x cp 2 x
accumulation 2 with fsdp over all 4, resumes across layouts (fsdp 2 -> 1 process, 1 process -> fsdp 2, fsdp cp=2 on 4
ranks -> fsdp cp=1 on 2), and the sharded checkpoints read by `lcft export` and `lcft eval`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained
from lcft.checkpoint.layout import read_model_meta
from lcft.checkpoint.model_files import is_sharded_checkpoint
from lcft.checkpoint.reader import load
from lcft.config import ConfigError
from lcft.evaluate.config import EvalConfig
from lcft.evaluate.runner import evaluate
from lcft.genomics.shards import read_manifest
from lcft.launch import run
from lcft.train import TrainConfig, train
from lcft.train.metrics import read_metrics
from tests.parallel.oracle import same_grad_norms, same_samples

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 9 runs, 1-4 processes each: ~1 min on 2 cores

STEP = "checkpoints/step-{:08d}"
GENERATION_CONFIG, GENERATION = "generation_config.json", b'{"eos_token_id": [2, 3], "max_length": 4096}\n'


def _base(data: Path, init: Path) -> dict:
    return dict(data=str(data), init=str(init), seq_len=512, steps=3, global_batch=2, micro_batch=1, warmup=1,
                lr=1e-3, precision="fp32", save_every=1, keep_last=0, progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cp_data_dir, cp_init_dir) -> Path:
    """one: 1 process, accumulation 2 (the oracle). fsdp2: 2 ranks. one4: 1 process, global batch 4 (accumulation
    4; the oracle of fsdp_dpcp and cp2_to_cp1). fsdp_dpcp: global batch 4 on dp 2 x cp 2, so accumulation 2 on each
    rank (the production layout: every factor of the normaliser and the sampler's split above 1), fsdp over all 4.
    to_one / from_one / cp2_to_cp1: step 1 of fsdp2 / one / fsdp_dpcp resumed on 1 process / fsdp 2 ranks /
    fsdp 2 ranks with cp=1 (dp 2 x accumulation 2), then steps 2-3. init_one (the oracle of fsdp_cp2) / fsdp_cp2:
    a new run from --init fsdp2's step 1 (sharded) on 1 process (accumulation 2) / dp 1 x cp 2 (accumulation 2 on
    each rank), fsdp over both. All start from the small model beside a generation_config.json."""
    root = tmp_path_factory.mktemp("fsdp")
    shutil.copytree(cp_init_dir, root / "init")
    (root / "init" / GENERATION_CONFIG).write_bytes(GENERATION)  # carried by every checkpoint and the export
    base = _base(cp_data_dir, root / "init")
    train(TrainConfig(out=str(root / "one"), **base))
    s = run("train", TrainConfig(out=str(root / "fsdp2"), nproc=2, shard="fsdp", **base))
    assert s["world_size"] == 2 and s["step"] == 3
    base4 = dict(base, global_batch=4)
    train(TrainConfig(out=str(root / "one4"), **base4))
    s = run("train", TrainConfig(out=str(root / "fsdp_dpcp"), nproc=4, cp=2, shard="fsdp", **base4))
    assert s["world_size"] == 4 and s["step"] == 3
    train(TrainConfig(out=str(root / "to_one"), resume=str(root / "fsdp2" / STEP.format(1)), **base))
    run("train", TrainConfig(out=str(root / "from_one"), resume=str(root / "one" / STEP.format(1)), nproc=2,
                      shard="fsdp", **base))
    run("train", TrainConfig(out=str(root / "cp2_to_cp1"), resume=str(root / "fsdp_dpcp" / STEP.format(1)), nproc=2,
                      shard="fsdp", **base4))
    init = dict(base, init=str(root / "fsdp2" / STEP.format(1)))
    train(TrainConfig(out=str(root / "init_one"), **init))
    run("train", TrainConfig(out=str(root / "fsdp_cp2"), nproc=2, cp=2, shard="fsdp", **init))
    return root


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run)}


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load(ckpt).model.state_dict()


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_fsdp_two_ranks_equals_one_process(runs, cp_data_dir):
    one, two = _losses(runs / "one"), _losses(runs / "fsdp2")
    assert sorted(two) == [1, 2, 3]
    for step in (1, 2, 3):
        assert two[step] == pytest.approx(one[step], abs=1e-6)
    same_grad_norms(runs / "fsdp2", runs / "one")
    ckpt = runs / "fsdp2" / STEP.format(3)
    assert is_sharded_checkpoint(ckpt) and not list(ckpt.glob("*.safetensors"))  # no rank gathered the model
    assert len(list((ckpt / "dcp").glob("*.distcp"))) == 2  # each rank wrote its own shards
    assert read_model_meta(ckpt)["tokenizer"] == read_manifest(cp_data_dir)["tokenizer"]
    _same_weights(_weights(ckpt), _weights(runs / "one" / STEP.format(3)))


@pytest.mark.parametrize("run,oracle", [("fsdp_dpcp", "one4"), ("fsdp_cp2", "init_one")])
def test_fsdp_over_dp_x_cp_equals_one_process_with_accumulation(runs, run, oracle):
    one, sharded = _losses(runs / oracle), _losses(runs / run)
    assert sorted(sharded) == [1, 2, 3]
    for step in (1, 2, 3):
        assert sharded[step] == pytest.approx(one[step], rel=1e-5)
    same_samples(runs / run, runs / oracle)  # across dp x accumulation
    same_grad_norms(runs / run, runs / oracle)  # accumulation 2 on each rank: with dp 2 (fsdp_dpcp) or alone
    _same_weights(_weights(runs / run / STEP.format(3)), _weights(runs / oracle / STEP.format(3)))


def test_init_from_a_sharded_checkpoint(runs):
    """--init of a sharded checkpoint: read whole on one process, shard by shard under fsdp (fsdp_cp2); same
    first step."""
    one, fsdp = _losses(runs / "init_one"), _losses(runs / "fsdp_cp2")
    assert fsdp[1] == pytest.approx(one[1], rel=1e-6)
    _same_weights(_weights(runs / "fsdp_cp2" / STEP.format(1)), _weights(runs / "init_one" / STEP.format(1)))


@pytest.mark.parametrize("run,oracle", [("to_one", "one"), ("from_one", "one"), ("cp2_to_cp1", "one4")])
def test_resume_across_layouts_follows_the_straight_run(runs, run, oracle):
    resumed, one = _losses(runs / run), _losses(runs / oracle)
    assert sorted(resumed) == [2, 3]
    for step in (2, 3):
        assert resumed[step] == pytest.approx(one[step], rel=1e-5)
    same_samples(runs / run, runs / oracle)  # steps 2 and 3: the sampler resumed where it was
    same_grad_norms(runs / run, runs / oracle)
    _same_weights(_weights(runs / run / STEP.format(3)), _weights(runs / oracle / STEP.format(3)))


def test_export_streams_a_sharded_checkpoint_into_safetensors(runs, tmp_path):
    from typer.testing import CliRunner

    from lcft.cli.app import app

    out = tmp_path / "hf"
    res = CliRunner().invoke(app, ["export", str(runs / "fsdp2"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "model.safetensors").is_file()
    carried = [runs / name / STEP.format(3) for name in ("fsdp2", "fsdp_cp2", "to_one", "from_one")]
    for folder in (*carried, out):  # as --init had it: saved sharded, resumed across layouts, exported
        assert (folder / GENERATION_CONFIG).read_bytes() == GENERATION, folder
    _same_weights(from_pretrained(out).state_dict(), _weights(runs / "one" / STEP.format(3)))
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(out)
    assert hf.generation_config.eos_token_id == [2, 3] and hf.generation_config.max_length == 4096
    ours = from_pretrained(runs / "one" / STEP.format(3))
    ids = torch.randint(0, ours.config.vocab_size, (1, 64))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)


def test_eval_reads_a_sharded_checkpoint(runs, tmp_path, cp_data_dir):
    def report(ckpt: Path, name: str) -> dict:
        return evaluate(EvalConfig(data=str(cp_data_dir), checkpoints=(str(ckpt),), max_windows=2,
                                   out=str(tmp_path / name)))["checkpoints"][0]

    sharded, plain = report(runs / "fsdp2" / STEP.format(3), "sharded"), report(runs / "one" / STEP.format(3), "one")
    assert sharded["tokens"] == plain["tokens"]
    assert sharded["loss"] == pytest.approx(plain["loss"], rel=1e-5)


def test_offload_params_needs_fsdp():
    with pytest.raises(ConfigError, match="offload_params needs shard = 'fsdp'"):
        TrainConfig(offload_params=True)
    with pytest.raises(ConfigError, match="shard: .zero3. is not one of none, fsdp"):
        TrainConfig(shard="zero3")
