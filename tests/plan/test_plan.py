"""`lcft plan`: parameter counts against built models, saved activations against autograd's own saved tensors,
the sharding formulas, the CLI (the estimate against real CPU runs: test_plan_measured.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.cli.app import app
from lcft.model import Llama, LlamaConfig, preset
from lcft.plan.estimate import GIB, HOST_PROCESS, Layout, activation_bytes, estimate, with_changes
from lcft.plan.plan import Budget, fitting_changes, pick
from lcft.plan.shape import Shape
from lcft.train.step import LossModel
from tests.one_line import cli_fails

runner = CliRunner()

SHAPES = {
    "tiny": preset("tiny"),
    "small": preset("small"),
    "qwen3": LlamaConfig(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=48, qk_norm=True, model_type="qwen3"),
    "mixtral": LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, model_type="mixtral"),
    "tied": LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_parameter_count_matches_the_built_model(name: str) -> None:
    assert Shape.of(SHAPES[name]).params == Llama(SHAPES[name]).num_parameters()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["tiny", "qwen3"])
def test_saved_activations_match_autograd(name: str, precision: str) -> None:
    """The planned 'activations held' + the fused weight copies against the bytes of every tensor storage
    autograd saves in a real forward of the loss (no checkpointing; fp32, or bf16 autocast over fp32 weights as
    `lcft train --precision bf16` runs on one process: the residual stream stays fp32)."""
    cfg, length = SHAPES[name], 1024
    lm = LossModel(Llama(cfg), 1e-4, 8192)
    storages: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in lm.parameters()}  # saved weights are not activations

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(4, 8, (1, length))  # (1, L)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        lm(ids, ids)
    saved = sum(storages.values())
    lay = Layout(length, precision=precision, device="cpu")
    est = estimate(cfg, lay)
    planned = est.activations + est.weight_copies
    assert abs(planned / saved - 1) < 0.10, (planned / saved, planned, saved)


def test_fsdp_divides_the_state_by_the_world() -> None:
    cfg = preset("1b")
    none = estimate(cfg, Layout(8192, world=8, checkpointing="block"))
    fsdp = estimate(cfg, Layout(8192, world=8, checkpointing="block", shard="fsdp"))
    off = estimate(cfg, Layout(8192, world=8, checkpointing="block", shard="fsdp", offload_params=True))
    p = Shape.of(cfg).params
    assert none.parameters == 4 * p and none.gradients == 8 * p and none.optimizer == 8 * p  # DDP buckets
    assert fsdp.parameters == 4 * -(-p // 8) and fsdp.optimizer == 8 * -(-p // 8)
    assert off.parameters == off.gradients == off.optimizer == 0 and off.host == 16 * -(-p // 8)
    # FSDP2 computes with bf16 parameters and casts each block's input: the residual stream is bf16 there, fp32
    # under the autocast of an unsharded bf16 run; in fp32 sharding moves state, not activations
    assert fsdp.activations < none.activations
    fp32 = [estimate(cfg, Layout(8192, world=8, checkpointing="block", shard=s, precision="fp32")) for s in ("none", "fsdp")]
    assert fp32[0].activations == fp32[1].activations


def test_cp_and_checkpointing_shrink_activations() -> None:
    shape = Shape.of(preset("1b"))
    full = sum(activation_bytes(shape, Layout(1 << 16)))
    cp4 = sum(activation_bytes(shape, Layout(1 << 16, world=4, cp=4)))
    block = sum(activation_bytes(shape, Layout(1 << 16, checkpointing="block")))
    assert cp4 == pytest.approx(full / 4, rel=0.02)
    assert block < full / 5
    stream = estimate(preset("1b"), Layout(1 << 20, world=8, cp=8, cp_kv="stream", checkpointing="block")).kv
    gathered = estimate(preset("1b"), Layout(1 << 20, world=8, cp=8, cp_kv="all", checkpointing="block")).kv
    assert stream < gathered / 4


def test_cli_fits_and_does_not_fit(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "64K", "--checkpointing", "block"])
    assert ok.exit_code == 0, ok.output
    assert "verdict: fits" in ok.output and "activations held" in ok.output
    big = runner.invoke(app, ["plan", "--preset", "1b", "--seq-len", "1M", "--nproc", "8"])
    assert big.exit_code == 1
    assert "does not fit" in big.output and "it would fit with:" in big.output and "--cp 8" in big.output
    node = runner.invoke(app, ["plan", "--preset", "1b", "--seq-len", "1M", "--gpus-per-node", "8", "--nnodes", "2",
                               "--rdzv-endpoint", "h:1", "--cp", "8", "--checkpointing", "block"])
    assert node.exit_code == 0, node.output
    assert "16 cuda rank(s) = dp 2 x cp 8" in node.output


def test_the_cheapest_changes_are_listed_first() -> None:
    """1b at 1M on 8 GPUs: the smallest cp that fits comes before a larger one, a larger cp with fsdp before any
    host offload, and every listed set fits."""
    model = preset("1b")
    model.attention.backend = "sparse"
    lay = Layout(1 << 20, world=8)
    at80 = fitting_changes(model, lay, Budget(80 * GIB))
    assert [f for f, _ in at80][:3] == ["--checkpointing block --cp 8", "--checkpointing block --cp 4 --shard fsdp",
                                        "--cp 2 --checkpointing block --offload-activations"]
    at40 = [f for f, e in fitting_changes(model, lay, Budget(40 * GIB)) if e.total <= 40 * GIB]
    offloads = [i for i, f in enumerate(at40) if "offload" in f]
    assert offloads and at40.index("--checkpointing block --cp 8 --shard fsdp") < min(offloads), at40
    assert len(at40) == 5  # the limit, all fitting


def test_cli_reads_only_config_json_of_init(tmp_path: Path) -> None:
    """An --init folder with config.json and nothing else (no weights) plans as the saved model would."""
    src = tmp_path / "model"
    save_pretrained(Llama(SHAPES["qwen3"]), src)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((src / "config.json").read_text())
    r = runner.invoke(app, ["plan", "--init", str(bare), "--seq-len", "4096", "--gpu-memory", "24GiB"])
    assert r.exit_code == 0, r.output
    n = Shape.of(SHAPES["qwen3"]).params
    assert (f"{n / 1e9:.3f}B parameters" if n >= 1e8 else f"{n / 1e6:.1f}M parameters") in r.output
    assert json.loads((bare / "config.json").read_text())["model_type"] == "qwen3"


def test_host_memory_counts_what_the_nodes_ranks_offload() -> None:
    """1b at 1M on one 141 GB GPU fits only with the block inputs in host memory: 2^20 tokens x N blocks x H x 4 B
    (bf16 autocast keeps the residual stream fp32), plus HOST_PROCESS per process. 192 GiB of host memory takes
    it; 128 GiB takes them in bf16 (--offload-bf16: 2 B each), 64 GiB nothing."""
    model = preset("1b")
    model.attention.backend = "sparse"
    lay, gpu = Layout(1 << 20), 141 * 10**9
    offloaded = (1 << 20) * model.num_hidden_layers * model.hidden_size * 4
    flags, changed, est = pick(model, lay, Budget(gpu))
    assert flags == "--checkpointing block --offload-activations" and est.host == offloaded
    assert pick(model, lay, Budget(gpu, 192 * GIB)) == (flags, changed, est)
    assert Budget(gpu, 192 * GIB).host_need(est) == offloaded + HOST_PROCESS
    flags16, changed16, est16 = pick(model, lay, Budget(gpu, 128 * GIB))
    assert flags16 == f"{flags} --offload-bf16" and changed16.offload_bf16 and est16.host == offloaded // 2
    assert est16.total == est.total  # the GPU holds the same: the recompute brings each input back in fp32
    assert pick(model, lay, Budget(gpu, 64 * GIB)) is None
    short = estimate(model, Layout(1 << 12, world=8))  # nothing offloaded: the weights read at start count
    need = 8 * (4 * Shape.of(model).params + HOST_PROCESS)
    assert Budget(gpu, need, ranks_per_node=8).admits(short) and not Budget(gpu, need - 1, ranks_per_node=8).admits(short)


def test_offload_bf16_is_offered_only_where_it_halves_something() -> None:
    """Under bf16 autocast over fp32 weights (one GPU, DDP) the block inputs are fp32 and --offload-bf16 is one of
    the changes; not in an fp32 plan (it would round what the run computes in: refused when asked for), nor where
    FSDP2's bf16 parameters already make the residual stream bf16."""
    from lcft.plan.plan import single_changes

    model = preset("1b")
    flags = [o.flags for o in single_changes(Layout(1 << 20, checkpointing="block"), model)]
    assert "--offload-activations --offload-bf16" in flags and "--offload-activations" in flags
    assert not any("bf16" in o.flags for o in single_changes(Layout(1 << 20, precision="fp32"), model))
    assert not any("bf16" in o.flags for o in single_changes(Layout(1 << 20, world=8, shard="fsdp"), model))
    on = ["plan", "--preset", "1b", "--seq-len", "1M", "--gpu-memory", "141GB", "--checkpointing", "block",
          "--offload-activations", "--offload-bf16"]
    ok = runner.invoke(app, on)
    assert ok.exit_code == 0 and "checkpointing block + offload (bf16)" in ok.output, ok.output
    assert "host memory (offloaded)            88.00 GiB" in ok.output, ok.output
    fp32 = runner.invoke(app, [*on, "--precision", "fp32"])
    assert fp32.exit_code != 0 and "--offload-bf16 needs bf16 precision" in fp32.output, fp32.output
    assert len(fp32.output.strip().splitlines()) == 1
    alone = runner.invoke(app, ["plan", "--preset", "1b", "--seq-len", "1M", "--offload-bf16"])
    assert alone.exit_code != 0 and "--offload-bf16 needs --offload-activations" in alone.output, alone.output


def test_on_a_cpu_run_an_offload_stays_in_the_same_memory() -> None:
    """A CPU run's host copies of its block inputs are in the memory the plan budgets (an exact copy is the input
    itself), and fsdp's offloaded parameters stay where they were (the trainer moves nothing on CPU): neither
    frees anything there, and neither is offered; bf16 copies hold N x n x H x 2 B instead of 4."""
    from lcft.plan.plan import single_changes

    model = preset("tiny")
    n = 1 << 16
    block = Layout(n, checkpointing="block", precision="bf16", device="cpu")
    exact, bf16 = (with_changes(block, offload_activations=True, offload_bf16=b) for b in (False, True))
    assert estimate(model, exact) == estimate(model, block) and estimate(model, exact).host == 0
    saved = estimate(model, block).activations - estimate(model, bf16).activations
    assert saved == n * model.num_hidden_layers * model.hidden_size * 2 and estimate(model, bf16).host == 0
    fsdp = Layout(n, world=2, shard="fsdp", checkpointing="block", device="cpu")
    assert estimate(model, with_changes(fsdp, offload_params=True)) == estimate(model, fsdp)
    flags = [o.flags for o in single_changes(with_changes(fsdp, precision="bf16"), model)]
    assert flags[-1] == "--offload-activations --offload-bf16" and not any("params" in f for f in flags), flags
    cuda = [o.flags for o in single_changes(with_changes(fsdp, device="cuda", shard="none"), model)]
    assert "--offload-activations" in cuda and cuda[-1] == "--shard fsdp --offload-params", cuda


def test_cli_host_memory_verdict() -> None:
    base = ["plan", "--preset", "1b", "--attention", "sparse", "--seq-len", "1M", "--gpu-memory", "141GB",
            "--checkpointing", "block", "--offload-activations"]
    ok = runner.invoke(app, [*base, "--host-memory", "192GiB"])
    assert ok.exit_code == 0, ok.output
    weights = 4 * Shape.of(preset("1b")).params / GIB  # under the 176 GiB offloaded: not what the node needs
    assert (f"1 rank(s) x (max(176.00 GiB offloaded, {weights:.2f} GiB of weights read at start) + 4.00 GiB process) "
            "= 180.00 GiB   of 192.00 GiB") in ok.output, ok.output
    assert "verdict: fits (" in ok.output and ", 12.00 GiB of host memory)" in ok.output, ok.output
    short = runner.invoke(app, [*base, "--host-memory", "178GiB"])
    assert short.exit_code == 1 and "verdict: does not fit (host memory 2.00 GiB over)" in short.output, short.output


@pytest.mark.parametrize("host", [None, "256GiB"])
def test_offload_sets_alike_on_the_gpu_say_once_that_the_host_tells_them_apart(host) -> None:
    """1b at 1M on one 141 GB GPU fits with the block inputs offloaded, exact or in bf16: the same GPU figure, 176
    or 88 GiB of host memory. Without --host-memory the two rows read alike: one note says why; with it each row
    shows its host need, and no note. A list whose offload rows differ on the GPU has no note either."""
    args = ["plan", "--preset", "1b", "--attention", "sparse", "--seq-len", "1M", "--gpu-memory", "141GB"]
    r = runner.invoke(app, [*args, *(["--host-memory", host] if host else [])])
    assert r.exit_code == 1, r.output
    listed = r.output.split("it would fit with:\n")[1].splitlines()
    rows = [line.split("GiB")[0].split() for line in listed if line.startswith("  ")]
    assert rows == [["--checkpointing", "block", "--offload-activations", "91.87"],
                    ["--checkpointing", "block", "--offload-activations", "--offload-bf16", "91.87"]], r.output
    note = "note: host memory is not checked without --host-memory"
    assert r.output.count(note) == (0 if host else 1) and (host or listed[2].startswith(note)), r.output
    assert host is None or "host 180.00 GiB" in listed[0] and "host 92.00 GiB" in listed[1], r.output
    apart = runner.invoke(app, ["plan", "--preset", "small", "--seq-len", "256K", "--gpu-memory", "24GiB",
                                "--precision", "fp32"])
    assert "--offload-activations" in apart.output and note not in apart.output, apart.output


def test_each_rank_reads_the_whole_model_into_host_memory_at_start() -> None:
    """A CUDA rank builds the whole model in fp32 on the CPU before it moves to the GPU or FSDP shards it (a fresh
    preset, or safetensors read whole: one copy, tests/model/test_checkpoints.py measures it), fsdp included:
    GENERator-3B as published on an 8-GPU node needs 8 x (4 B x P + HOST_PROCESS), P counted by transformers'
    own model; one byte less does not fit. A sharded checkpoint under fsdp is read shard by shard: nothing."""
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    from tests.conftest import SHARED_PUBLISHED as PUBLISHED

    folder = PUBLISHED / "generator-eukaryote-3b-base"
    if not folder.is_dir():
        pytest.skip(f"published model files not found at {PUBLISHED}")
    with torch.device("meta"):
        p = sum(t.numel() for t in LlamaForCausalLM(HFConfig.from_pretrained(folder)).parameters())
    need = 8 * (4 * p + HOST_PROCESS)
    base = ["plan", "--init", str(folder), "--seq-len", "64K", "--nproc", "8", "--gpu-memory", "80GiB", "--cp", "8",
            "--shard", "fsdp", "--checkpointing", "block"]
    ok = runner.invoke(app, [*base, "--host-memory", str(need)])
    assert ok.exit_code == 0 and f"(max(0.00 GiB offloaded, {4 * p / GIB:.2f} GiB of weights read at start)" in ok.output
    assert "verdict: fits (" in ok.output and ", 0.00 GiB of host memory)" in ok.output, ok.output
    short = runner.invoke(app, [*base, "--host-memory", str(need - 1)])
    assert short.exit_code == 1 and "verdict: does not fit (host memory 0.00 GiB over)" in short.output, short.output
    model = preset("1b")
    assert estimate(model, Layout(1 << 16, world=8, shard="fsdp")).load == 4 * Shape.of(model).params
    assert estimate(model, Layout(1 << 16, world=8, shard="fsdp", sharded_source=True)).load == 0
    assert estimate(model, Layout(1 << 16, sharded_source=True)).load == 4 * Shape.of(model).params  # read whole


def test_cli_errors_are_one_line() -> None:
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "4096", "--gpu-memory", "lots"])
    assert r.exit_code != 0 and "--gpu-memory" in r.output and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "4096", "--nproc", "3", "--cp", "2"])
    assert r.exit_code != 0 and "world size 3 is not divisible by cp=2" in " ".join(r.output.split())


@pytest.mark.parametrize("args,split", [(["--nproc", "3"], "8 is not a multiple of --micro-batch x data-parallel "
                                          "ranks (1 x 3): 6 or 9 would split"),
                                        (["--nproc", "4", "--cp", "2", "--global-batch", "3"], "3 is not a multiple "
                                         "of --micro-batch x data-parallel ranks (1 x 2): 2 or 4 would split"),
                                        (["--nnodes", "3", "--gpus-per-node", "1", "--rdzv-endpoint", "h:1"],
                                         "8 is not a multiple of --micro-batch x data-parallel ranks (1 x 3): 6 or 9 would split")])
def test_a_layout_train_refuses_is_refused_by_plan(args: list[str], split: str) -> None:
    """The plan said "fits" for a layout `lcft train` then refused (its default global_batch of 8 does not
    split over 3 data-parallel ranks): both check it in one place (lcft.train.run_dir.check_launch)."""
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "4096", *args])
    assert r.exit_code == 1 and " ".join(r.output.split()) == f"error: --global-batch {split}", r.output


@pytest.mark.parametrize("manifest", [None, {"format_version": 1}, {"format_version": 1, "length": "4K"}])
def test_data_whose_manifest_is_not_as_prepared_is_one_line(tmp_path: Path, manifest: dict | None) -> None:
    """--data: its window length is read through the manifest's reader (it was read raw: a KeyError or
    ValueError traceback for a manifest without a whole 'length')."""
    if manifest is not None:
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--data", str(tmp_path)])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and str(tmp_path) in r.output, r.output


@pytest.mark.parametrize("args,needle", [
    (["--seq-len", str(2**34 + 8)], "--seq-len must be at most 17,179,869,184"),
    (["--seq-len", "1" + "0" * 330], "--seq-len: <int of 1097 bits> is past the 64-bit range"),
    (["--seq-len", "9" * 400 + "K"], "--seq-len: <int of 1339 bits> is past the 64-bit range"),
    (["--nproc", "8", "--global-batch", str(2**31 + 8)], "--global-batch must be at most 2,147,483,648"),
    (["--nproc", str(2**20 + 1)], "--nproc must be at most 1,048,576"),
    (["--nproc", str(10**320)], "--nproc: <int of 1064 bits> is past the 64-bit range"),
    (["--gpus-per-node", str(2**20 + 1)], "--gpus-per-node must be at most 1,048,576"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be at least 1"),
])
def test_cli_counts_no_run_reaches_are_one_line(args, needle) -> None:
    """These were an OverflowError in the estimate, or a plan that fits."""
    cli_fails(["plan", "--preset", "tiny", *(["--seq-len", "4K"] if "--seq-len" not in args else []), *args], needle)


def test_the_largest_counts_are_planned() -> None:
    """At every limit at once the figures stay finite: a verdict, not a traceback."""
    base = ["plan", "--preset", "tiny", "--seq-len", "16G", "--global-batch", str(2**31), "--gpu-memory", str(2**60)]
    for args in (["--micro-batch", str(2**31)],
                 ["--micro-batch", "2048", "--nproc", str(2**20), "--host-memory", str(2**60)]):
        r = runner.invoke(app, [*base, *args])
        assert isinstance(r.exception, SystemExit) and "verdict: does not fit" in r.output, (r.exception, r.output)


@pytest.mark.parametrize("nproc,shard,warned", [("1", "none", True), ("2", "fsdp", False)])
def test_cli_says_when_shard_fsdp_does_nothing(nproc, shard, warned) -> None:
    """One process holds the whole model: the plan is DDP's, and says why --shard fsdp changed nothing."""
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "4K", "--shard", "fsdp", "--nproc", nproc,
                            "--global-batch", nproc])
    assert r.exit_code == 0, r.output
    assert f"; shard {shard}; " in r.output
    assert ("warning: --shard fsdp has no effect on one process" in r.output) == warned, r.output


def test_an_init_of_another_vocabulary_than_the_datas_is_refused_as_train_refuses_it(tmp_path: Path) -> None:
    """METAGENE-1 (a BPE of 1,024 tokens) over char windows: `lcft train` refused it, `lcft plan` planned it.
    Both run the one check (lcft.checkpoint.layout.check_tokenizer); windows cut with the model's own tokenizer
    are planned."""
    from lcft.genomics import prepare_windows
    from tests.conftest import SHARED_GENOMES
    from tests.conftest import SHARED_PUBLISHED as PUBLISHED

    init = PUBLISHED / "metagene-1"
    if not init.is_dir():
        pytest.skip(f"published model files not found at {PUBLISHED}")
    record = "gi|9626243|ref|NC_001416.1|"  # the lambda phage genome, 48 kbp
    for name, tokenizer in (("char", "char"), ("own", str(init))):
        prepare_windows(fasta=str(SHARED_GENOMES / "lambda_phage_NC_001416.1.fa"), out=str(tmp_path / name),
                        length=4096, train=(record,), eval=(), tokenizer=tokenizer)
    args = ["--init", str(init), "--data", str(tmp_path / "char"), "--seq-len", "4096"]
    planned = cli_fails(["plan", *args], "vocab_size 1024 differs from the data tokenizer's 16")
    trained = cli_fails(["train", *args, "--out", str(tmp_path / "run"), "--no-progress"])
    assert trained.replace(str(init.resolve()), "INIT") == planned.replace(str(init), "INIT")  # train resolves links
    r = runner.invoke(app, ["plan", *args[:2], "--data", str(tmp_path / "own"), "--seq-len", "4096", "--gpu-memory", "1T"])
    assert r.exit_code == 0 and "verdict: fits" in r.output, r.output


@pytest.mark.parametrize("preset, shown", [("tiny", "M parameters"), ("1b", "0.992B parameters")])
def test_the_model_size_is_shown_in_millions_below_a_tenth_of_a_billion(preset, shown):
    """The tiny preset read '0.004B parameters'."""
    r = runner.invoke(app, ["plan", "--preset", preset, "--seq-len", "4096"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("model: "))
    assert shown in line and ".000B" not in line and "0.00" not in line, line


def test_a_cpu_plan_counts_the_threads_of_the_cpus_the_ranks_may_use(monkeypatch):
    """On a node of 64 CPUs of which this process may use its affinity's (a Slurm cpuset, a container's quota),
    each of 2 launched ranks gets a share of those, as the launcher gives it (OMP_NUM_THREADS): the plan had
    counted 31 threads beyond the first, each with its share of the block transient."""
    import os
    import re

    from lcft.cpus import usable_cpus

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "4096", "--device", "cpu", "--nproc", "2",
                            "--explain"])
    assert r.exit_code == 0, r.output
    beyond = re.search(r"x (\d+) threads beyond the first", r.output)
    threads = int(beyond.group(1)) + 1 if beyond else 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 64
    assert threads == max(1, usable_cpus() // 2) and threads <= max(1, affinity // 2), r.output


@pytest.mark.parametrize("nodes,nproc,want", [(2, 1, 64), (2, 2, 32), (1, 4, 16)])
def test_a_cpu_plan_of_several_nodes_counts_each_nodes_share(monkeypatch, nodes: int, nproc: int, want: int):
    """The launcher on each node shares that node's CPUs among its own ranks (--nproc), whatever the other nodes
    run: the plan divided them by the ranks of all nodes (2 nodes of 1 rank on 64 CPUs: 32 threads, not 64)."""
    import re

    import lcft.plan.plan as plan

    monkeypatch.setattr(plan, "usable_cpus", lambda: 64)
    more = ["--nnodes", str(nodes), "--rdzv-endpoint", "h:1"] if nodes > 1 else []
    r = runner.invoke(app, ["plan", "--preset", "tiny", "--seq-len", "4096", "--device", "cpu", "--nproc", str(nproc),
                            "--global-batch", str(nodes * nproc), *more, "--explain"])
    assert r.exit_code == 0, r.output
    beyond = re.search(r"x (\d+) threads beyond the first", r.output)
    assert beyond and int(beyond.group(1)) + 1 == want, r.output
