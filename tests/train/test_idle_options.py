"""Options that change nothing on the layout a run gets (--shard fsdp and --offload-params on one process, --cp-kv
and --cp-layout without cp): a warning line naming each and why, rather than a run that looks sharded."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.train.config import TrainParallelConfig
from tests.train.launching import RUN

SHARD = ("warning: --shard fsdp has no effect on one process: nothing to shard across, it holds the whole model "
         "(start several with --nproc N)")
OFFLOAD = SHARD.replace("--shard fsdp has", "--shard fsdp --offload-params have")
KV = "warning: --cp-kv stream has no effect with cp 1: no window is split across ranks (--cp N splits each over N)"


@pytest.mark.parametrize("nproc", [[], ["--nproc", "1"]])
def test_train_on_one_process_says_which_options_do_nothing(tmp_path, data_dir, init_dir, nproc):
    """The run trains as the one process it is (the whole model, checkpoints as plain safetensors), saying so."""
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--data", str(data_dir), "--init", str(init_dir), "--out", str(out),
                                 *RUN, "--steps", "1", "--shard", "fsdp", "--offload-params", "--cp-kv", "stream",
                                 *nproc])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines.count(OFFLOAD) == 1 and lines.count(KV) == 1, r.stdout
    assert (out / "checkpoints" / "step-00000001" / "model.safetensors").is_file()
    r = CliRunner().invoke(app, ["train", "--data", str(data_dir), "--init", str(init_dir), "--out",
                                 str(tmp_path / "plain"), *RUN, "--steps", "1", *nproc])
    assert r.exit_code == 0 and "no effect" not in r.stdout, r.output


def test_which_options_do_nothing_on_which_layout():
    fsdp = TrainParallelConfig(shard="fsdp")
    assert fsdp.idle(1) == [SHARD] and fsdp.idle(2) == [] and fsdp.sharded(2) and not fsdp.sharded(1)
    assert TrainParallelConfig(shard="fsdp", offload_params=True).idle(1) == [OFFLOAD]
    assert TrainParallelConfig(cp_kv="stream").idle(4) == [KV]
    assert TrainParallelConfig(cp_kv="stream", cp=2).idle(2) == []
    assert TrainParallelConfig(cp_kv="selected", cp_layout="contiguous").idle(1) == [
        "warning: --cp-kv selected and --cp-layout contiguous have no effect with cp 1: no window is split across "
        "ranks (--cp N splits each over N)"]
    assert TrainParallelConfig().idle(1) == [] and TrainParallelConfig(cp_kv="all", cp_layout="zigzag").idle(1) == []
