"""`lcft train` through typer: the line that says how the invocation ended names the option or signal that ended
it, never summary.json's internal value; a log (stderr not a terminal) gets a line per step."""

from __future__ import annotations

import re

import pytest
import torch
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.cli.app import app
from lcft.genomics import prepare_windows
from lcft.model import Llama, LlamaConfig
from tests.conftest import SHARED_GENOMES

LAMBDA = SHARED_GENOMES / "lambda_phage_NC_001416.1.fa"


@pytest.fixture(scope="module")
def run_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """2K-token windows of the lambda phage genome and a 2-block model of hidden size 64: a step takes ms."""
    root = tmp_path_factory.mktemp("cli-train")
    prepare_windows(fasta=str(LAMBDA), out=str(root / "data"), length=2048, train=("gi|9626243|ref|NC_001416.1|",),
                    eval=())
    torch.manual_seed(0)
    save_pretrained(Llama(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2)), root / "init")
    return ["train", "--data", str(root / "data"), "--init", str(root / "init"), "--seq-len", "512",
            "--global-batch", "1", "--steps", "2", "--precision", "fp32", "--no-progress"]


def test_the_end_line_names_the_option_that_stopped_the_run(run_args, tmp_path):
    out = ["--out", str(tmp_path / "run")]
    r = CliRunner().invoke(app, [*run_args, *out, "--stop-after", "1"])
    assert r.exit_code == 0, r.output
    last = r.stdout.splitlines()[-1]
    assert last.startswith("stopped by --stop-after at step 1/2 loss "), last
    r = CliRunner().invoke(app, [*run_args, *out, "--resume", "auto"])
    assert r.exit_code == 0 and r.stdout.splitlines()[-1].startswith("done at step 2/2 loss "), r.output


def test_a_log_gets_a_line_per_step_unless_no_progress(run_args, tmp_path):
    """stderr a file (CliRunner's, as a batch job's log): a line for each of the 2 steps with its figures, the
    time so far and the ETA; it had stayed empty until the run ended. --no-progress: none."""
    args = [a for a in run_args if a != "--no-progress"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run"), "--warmup", "0"])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("train step ")]
    assert [line.split()[2] for line in lines] == ["1/2", "2/2"], r.stderr
    assert all(re.search(r" · loss \d\.\d{4} nats/token · .* · lr \S+ · .* · [\d,]+ tok/s · .* · elapsed \d:\d\d:\d\d "
                         r"· ETA \d:\d\d:\d\d$", line) for line in lines), lines
    r = CliRunner().invoke(app, [*run_args, "--out", str(tmp_path / "quiet"), "--warmup", "0"])
    assert r.exit_code == 0 and "train step" not in r.stderr, r.output


def test_a_run_that_never_leaves_warm_up_says_so_once(run_args, tmp_path):
    """--steps 2 under the default --warmup 10: lr 3e-5 then 6e-5 of a 3e-4 peak, said once at the start."""
    r = CliRunner().invoke(app, [*run_args, "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.stderr.splitlines() if "--warmup" in line]
    assert notes == ["note: --warmup 10 covers --steps 2: the learning rate only rises, to 6.00e-05 of the --lr "
                     "3.00e-04 peak, and never decays (a smaller --warmup or more --steps leaves warm-up)"], r.stderr
    r = CliRunner().invoke(app, [*run_args, "--out", str(tmp_path / "past"), "--warmup", "1"])
    assert r.exit_code == 0 and "--warmup" not in r.output, r.output


def test_a_signal_is_named():
    from lcft.cli.train import ended

    assert ended({"stopped": "signal", "signal": "SIGTERM"}) == "stopped by SIGTERM"


def test_every_way_a_run_ends_has_its_words():
    """Each `Ended` member has its own line (a dict lookup keyed by bare strings failed with KeyError on a kind it
    lacked); a value that is no `Ended` is a broken contract, not a line."""
    from lcft.cli.train import ended
    from lcft.signals import Ended

    words = {e: ended({"stopped": e, "signal": "SIGINT"}) for e in Ended}
    assert words == {Ended.DONE: "done", Ended.STOP_AFTER: "stopped by --stop-after",
                     Ended.SIGNAL: "stopped by SIGINT"}
    with pytest.raises(ValueError):
        ended({"stopped": "killed", "signal": None})
