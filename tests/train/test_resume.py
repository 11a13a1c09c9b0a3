"""Checkpoints and resume: exact resume, atomic saves under SIGKILL, SIGTERM, pruning, config next to each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lcft.checkpoint.hf_folder import from_pretrained, save_pretrained
from lcft.checkpoint.layout import list_checkpoints
from lcft.checkpoint.state import read_trainer_state
from lcft.config_toml import load_toml
from lcft.model import Llama, LlamaConfig
from lcft.signals import exit_code
from lcft.train import TrainConfig, TrainHooks, latest_checkpoint, train
from lcft.train.metrics import read_metrics


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return from_pretrained(ckpt).state_dict()


def test_exact_resume(tmp_path, base_cfg):
    """6 steps straight == 3 steps (--stop-after 3) then --resume auto to 6: same losses and weights."""
    straight = train(TrainConfig(out=str(tmp_path / "a"), **base_cfg))
    first = train(TrainConfig(out=str(tmp_path / "b"), stop_after=3, **base_cfg))
    assert first["stopped"] == "stop_after" and first["step"] == 3
    assert Path(first["checkpoint"]).name == "step-00000003"
    resumed = train(TrainConfig(out=str(tmp_path / "b"), resume="auto", **base_cfg))
    assert resumed["step"] == 6 and resumed["stopped"] == "done"

    la = [r["loss"] for r in read_metrics(tmp_path / "a")]
    lb = [r["loss"] for r in read_metrics(tmp_path / "b")]
    assert len(la) == len(lb) == 6
    torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), rtol=1e-6, atol=0)
    assert la[-1] < la[0]  # it trains
    wa, wb = weights(Path(straight["checkpoint"])), weights(Path(resumed["checkpoint"]))
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-6, atol=0)
    # the optimizer state too (Adam moments decide the next steps)
    sa, oa, _, _ = read_trainer_state(straight["checkpoint"])
    sb, ob, _, _ = read_trainer_state(resumed["checkpoint"])
    assert (sa.step, sa.samples_seen, sa.updates) == (sb.step, sb.samples_seen, sb.updates) == (6, 12, 6)
    for pa, pb in zip(oa["state"].values(), ob["state"].values(), strict=True):
        torch.testing.assert_close(pb["exp_avg_sq"], pa["exp_avg_sq"], rtol=1e-6, atol=0)


def assert_same_run(a: Path, b: Path) -> None:
    """Runs a and b logged the same steps and ended on the same weights and AdamW state, bit for bit."""
    fields = ("step", "loss", "lr", "grad_norm", "samples", "skipped")
    assert [[r[f] for f in fields] for r in read_metrics(b)] == [[r[f] for f in fields] for r in read_metrics(a)]
    ca, cb = latest_checkpoint(a), latest_checkpoint(b)
    wa, wb = weights(ca), weights(cb)
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    oa, ob = read_trainer_state(ca)[1]["state"], read_trainer_state(cb)[1]["state"]
    assert [(i, k) for i in oa for k in oa[i] if not torch.equal(oa[i][k], ob[i][k])] == []


@pytest.fixture(scope="module")
def bf16_mixtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Mixtral (router loss on) stored in bf16, as published models mostly are: --init casts it to fp32 as read,
    while a resume reads the run's fp32 checkpoint."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=24, rope_theta=1e6, model_type="mixtral",
                              num_local_experts=4, num_experts_per_tok=2, output_router_logits=True))
    return save_pretrained(model, tmp_path_factory.mktemp("mixtral") / "bf16", dtype=torch.bfloat16)


@pytest.mark.parametrize("options", ["every data and loss option", "bf16 mixtral init"])
def test_resume_is_the_run_that_never_stopped(tmp_path, base_cfg, bf16_mixtral, options):
    """Stopped after 3 of 6 steps (warm-up 4 crossing the stop) and resumed: every logged figure, the weights
    and the AdamW moments equal the uninterrupted run's bit for bit."""
    changes = {"init": str(bf16_mixtral)} if options == "bf16 mixtral init" else dict(
        rc_augment=0.5, softmask_loss_weight=0.2, z_loss=1e-2, grad_clip=0.5, global_batch=4, micro_batch=2,
        warmup=4, seq_len=256)
    cfg = {**base_cfg, **changes}
    train(TrainConfig(out=str(tmp_path / "a"), **cfg))
    train(TrainConfig(out=str(tmp_path / "b"), stop_after=3, **cfg))
    train(TrainConfig(out=str(tmp_path / "b"), resume="auto", **cfg))
    assert_same_run(tmp_path / "a", tmp_path / "b")


def test_checkpoint_layout_and_pruning(tmp_path, base_cfg):
    """8-digit step folders, HF files + config.toml + trainer_state/, only the newest keep_last kept,
    the resolved config saved at <run>/config.toml and next to each checkpoint."""
    run = tmp_path / "run"
    s = train(TrainConfig(out=str(run), **{**base_cfg, "save_every": 1, "keep_last": 2, "steps": 5}))
    names = [p.name for _, p in list_checkpoints(run)]
    assert names == ["step-00000004", "step-00000005"]
    ckpt = latest_checkpoint(run)
    assert ckpt == Path(s["checkpoint"])
    for f in ("config.json", "model.safetensors", "lcft.json", "config.toml", "trainer_state/state.json",
              "trainer_state/optimizer.pt", "trainer_state/scheduler.pt", "trainer_state/rng.pt"):
        assert (ckpt / f).is_file(), f
    saved = load_toml(run / "config.toml")
    assert saved == load_toml(ckpt / "config.toml")
    assert saved["steps"] == 5 and saved["seq_len"] == 512 and saved["keep_last"] == 2
    assert TrainConfig(**saved) == TrainConfig(**{**base_cfg, "out": str(run), "save_every": 1, "keep_last": 2,
                                                  "steps": 5, "data": saved["data"], "init": saved["init"]})
    rec = read_metrics(run)[-1]
    assert set(rec) >= {"step", "loss", "bits_per_base", "lr", "grad_norm", "tokens_per_s", "peak_mem",
                        "skipped", "elapsed"}
    assert rec["step"] == 5 and rec["peak_mem"] > 0 and rec["tokens_per_s"] > 0
    assert rec["bits_per_base"] == pytest.approx(rec["loss"] / 0.6931471805599453)


# Run in a fresh process, which SIGKILLs itself from TrainHooks.during_save midway through one checkpoint.
KILL_DRIVER = """
import json, os, signal, sys
from lcft.train import TrainConfig, TrainHooks, train

def kill(step, tmp):
    if step == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

train(TrainConfig(**json.loads(sys.argv[1])), TrainHooks(during_save=kill))
"""


def test_kill_while_saving_keeps_previous_checkpoint(tmp_path, base_cfg):
    """SIGKILL midway through writing step 4's checkpoint: step 2 stays complete and loadable, no step-4
    folder appears, and --resume auto continues from step 2 (and clears the partial folder)."""
    run = tmp_path / "run"
    driver = tmp_path / "kill_during_save.py"
    driver.write_text(KILL_DRIVER)
    cfg = json.dumps({**base_cfg, "save_every": 2, "out": str(run)})
    proc = subprocess.run([sys.executable, str(driver), cfg, "4"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [p.name for _, p in list_checkpoints(run)] == ["step-00000002"]
    assert (run / "checkpoints" / ".tmp-step-00000004" / "model.safetensors").is_file()  # the cut save
    weights(run / "checkpoints" / "step-00000002")
    assert read_trainer_state(run / "checkpoints" / "step-00000002")[0].step == 2
    s = train(TrainConfig(out=str(run), resume="auto", **{**base_cfg, "save_every": 2}))
    assert s["step"] == 6
    assert not (run / "checkpoints" / ".tmp-step-00000004").exists()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_and_stops(tmp_path, base_cfg, sig):
    """A real SIGTERM/SIGINT to this process at step 3 (from a hook, so the timing is exact): the step finishes,
    a checkpoint is written, train() returns normally (the CLI then exits 128 + the signal, see
    test_elastic_exit_codes), and the run resumes from there."""
    run = tmp_path / "run"
    cfg = {**base_cfg, "steps": 100}

    def send(step: int) -> None:
        if step == 3:
            os.kill(os.getpid(), sig)

    s = train(TrainConfig(out=str(run), **cfg), TrainHooks(before_step=send))
    assert s["stopped"] == "signal" and s["step"] == 3
    on_disk = json.loads((run / "summary.json").read_text())  # its name for people, its number for the exit code
    assert (on_disk["signal"], on_disk["signal_number"], exit_code(on_disk)) == (sig.name, int(sig), 128 + sig)
    assert read_trainer_state(latest_checkpoint(run))[0].step == 3
    assert signal.getsignal(sig) is not None  # handlers restored after the run
    s = train(TrainConfig(out=str(run), resume="auto", stop_after=1, **cfg))
    assert s["step"] == 4 and s["stopped"] == "stop_after" and (s["signal"], s["signal_number"]) == (None, None)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]


@pytest.mark.parametrize("when", ["during_the_last_step", "during_the_final_save"])
def test_a_signal_as_the_run_finishes_leaves_it_done(tmp_path, base_cfg, capsys, when):
    """SIGTERM during the last step (or the final save after it): every step is done and saved, so the run ends
    "done" with exit code 0 and no advice to resume; its summary still names the signal (a caller that chains work
    after the run stops there), and --resume auto then finds it finished, as any finished run."""
    cfg, run = {**base_cfg, "save_every": 4}, tmp_path / "run"  # 6 steps: the last one saved after the loop
    last = cfg["steps"]

    def send(step: int, *_tmp: Path) -> None:
        if step == last:
            os.kill(os.getpid(), signal.SIGTERM)

    hooks = TrainHooks(before_step=send) if when == "during_the_last_step" else TrainHooks(during_save=send)
    s = train(TrainConfig(out=str(run), **cfg), hooks)
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(s))
    assert (s["stopped"], s["step"], s["signal"], s["signal_number"], exit_code(s)) == ("done", last, "SIGTERM", 15, 0)
    out = capsys.readouterr().err  # the run's notes
    assert "--resume" not in out and f"SIGTERM came as this invocation ended, at step {last}/{last}; the run is " \
        "complete, nothing to resume" in out, out
    assert read_trainer_state(latest_checkpoint(run))[0].step == last
    s = train(TrainConfig(out=str(run), resume="auto", **cfg))
    assert (s["stopped"], s["step"], s["signal"], exit_code(s)) == ("done", last, None, 0)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, last + 1))


def test_a_signal_while_saving_stops_on_the_step_saved(tmp_path, base_cfg):
    """SIGTERM while step 4's checkpoint is being written (every 4th step saved, of 6): the run stops on step 4,
    saved once; not after a step 5 and its save, which at long contexts would spend the scheduler's grace time.
    The CLI exits 143, and --resume auto ends as the uninterrupted one-process run, bit for bit."""
    cfg, run = {**base_cfg, "save_every": 4}, tmp_path / "b"
    steps: list[int] = []
    saves: list[int] = []

    def during_save(step: int, _tmp: Path) -> None:
        saves.append(step)
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    s = train(TrainConfig(out=str(run), **cfg), TrainHooks(before_step=steps.append, during_save=during_save))
    assert (s["stopped"], s["signal"], s["step"], exit_code(s)) == ("signal", "SIGTERM", 4, 143)
    assert (steps, saves) == ([1, 2, 3, 4], [4])
    assert [p.name for _, p in list_checkpoints(run)] == ["step-00000004"]
    assert read_trainer_state(latest_checkpoint(run))[0].step == 4
    train(TrainConfig(out=str(run), resume="auto", **cfg))
    train(TrainConfig(out=str(tmp_path / "a"), **cfg))
    assert_same_run(tmp_path / "a", run)
