"""Real write faults through the CLI: a file-size limit (RLIMIT_FSIZE, so a write fails with EFBIG) and a folder
made read-only; one `error:` line naming what failed, nothing half-written, and a rerun that matches an
uninterrupted run."""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lcft.checkpoint.hf_folder import save_pretrained
from lcft.checkpoint.layout import list_checkpoints, verify_checkpoint
from lcft.cli.app import app
from lcft.errors import RESUME
from lcft.folder_lock import LOCK_NAME
from lcft.genomics import prepare_windows
from lcft.model import Llama, LlamaConfig
from lcft.train.metrics import read_metrics
from tests.cli.preloaded import Preloaded, preloaded  # noqa: F401  (a fixture, by name)
from tests.conftest import SHARED_GENOMES
from tests.unprivileged import unprivileged

ROOT = Path(__file__).resolve().parents[2]
LAMBDA = SHARED_GENOMES / "lambda_phage_NC_001416.1.fa"
TRAIN = ["--seq-len", "512", "--global-batch", "2", "--micro-batch", "1", "--warmup", "1", "--lr", "1e-3",
         "--precision", "fp32", "--no-progress", "--steps", "6"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2K-token windows of the lambda phage genome (23 train windows, no eval split)."""
    out = tmp_path_factory.mktemp("wf-data") / "windows"
    prepare_windows(fasta=str(LAMBDA), out=str(out), length=2048, train=("gi|9626243|ref|NC_001416.1|",), eval=())
    return out


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh 2-block model of hidden size 64 (its model.safetensors is about 340 KB)."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("wf-init") / "model"
    save_pretrained(Llama(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, rope_theta=1e6)), out)
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def lcft(limit: int, *args: str | Path) -> subprocess.CompletedProcess:
    """`python -m lcft ARGS` in a child whose files may not grow past `limit` bytes; Python ignores SIGXFSZ, so a
    write past it fails with EFBIG as on a filesystem's own limit."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run([sys.executable, "-m", "lcft", *map(str, args)], preexec_fn=limited, env=_env(),
                          capture_output=True, text=True, timeout=300)


def forked(server: Preloaded, limit: int, *args: str | Path) -> subprocess.CompletedProcess:
    """`lcft ARGS` as `lcft()` runs it, forked from the module's preloaded process: for a write that fails
    mid-run, long after the start-up (imports are not under test), whose seconds are then paid once."""
    return server.run(["-m", "lcft", *map(str, args)], env=_env(), limit=limit)


def here(*args: str | Path) -> None:
    """`lcft ARGS` in this process, without a limit, succeeding (oracles and reruns: no child's start-up)."""
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, (r.output, r.exception)


def one_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 1 with one `error:` line holding every needle, and no traceback."""
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-3000:]
    line = lines[0]
    assert all(n in line for n in needles), line
    return line


def leftovers(folder: Path) -> list[Path]:
    """Temp files and folders of a write that did not finish."""
    return [p for p in folder.rglob("*") if p.name.startswith(".") and (".tmp" in p.name or p.name.endswith(".tmp"))]


def same_tensors(a: Path, b: Path) -> None:
    ta, tb = load_file(a), load_file(b)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("command", ["prepare", "train", "eval", "export"])
def test_the_lock_file_past_the_file_size_limit(tmp_path, data, init, preloaded, command):  # noqa: F811
    """Every command's first write, its pid into the output folder's lock file, past a limit of 10 bytes (as
    on a full disk: the rerun after a run that died of one): one line naming the folder and the limit; a new
    folder is not made, a killed run's folder keeps no lock file, half-written or stale."""
    out = tmp_path / "out"
    if command == "train":  # a killed run's folder
        out.mkdir()
        (out / LOCK_NAME).write_text("1 lcft train\n")
    args = {"prepare": ["prepare", "windows", "--fasta", LAMBDA, "--length", "2048", "--train",
                        "gi|9626243|ref|NC_001416.1|", "--eval", ""],
            "train": ["train", "--data", data, "--init", init, *TRAIN],
            "eval": ["eval", "--data", data, "--split", "train", "--checkpoint", init],
            "export": ["export", init]}[command]
    # prepare (no torch) and train (torch and the trainer's imports) start afresh under the limit, their start-up
    # included; eval and export fork from the preloaded process: the same lock, without a second torch start-up
    run = lcft if command in ("prepare", "train") else functools.partial(forked, preloaded)
    one_error(run(10, *args, "--out", out), f"cannot write to output folder {out}: File too large (errno 27)",
              "the file-size limit (ulimit -f) is 10 bytes")
    assert sorted(os.listdir(tmp_path)) == (["out"] if command == "train" else [])
    assert not out.exists() or os.listdir(out) == []


def test_export_past_the_file_size_limit(tmp_path, init, preloaded):  # noqa: F811
    """model.safetensors past the limit: one line naming --out and the limit, no --out, no temp sibling; the
    export without the limit writes the tensors an uninterrupted export writes."""
    oracle, out = tmp_path / "oracle", tmp_path / "out"
    here("export", init, "--out", oracle)
    one_error(forked(preloaded, 100_000, "export", init, "--out", out), str(out), "file too large",
              "ulimit -f: 100,000 bytes")
    assert sorted(os.listdir(tmp_path)) == ["oracle"]
    here("export", init, "--out", out)
    same_tensors(out / "model.safetensors", oracle / "model.safetensors")


def test_prepare_past_the_file_size_limit(tmp_path):
    """A window shard past the limit: one line naming the partial folder, the OS's words and the limit (they do
    not name `ulimit -f`); the same command without the limit resumes to the shards of an uninterrupted run."""
    yeast = SHARED_GENOMES / "sacCer3_chrIV.fa"
    oracle, out = tmp_path / "oracle", tmp_path / "out"
    args = ["prepare", "windows", "--fasta", yeast, "--length", "64K", "--train", "chrIV", "--eval", ""]
    here(*args, "--out", oracle)
    one_error(lcft(200_000, *args, "--out", out), str(out), "File too large",
              "the file-size limit (ulimit -f) is 200,000 bytes", RESUME)
    here(*args, "--out", out)
    shards = sorted(p.name for p in oracle.iterdir() if p.is_file())
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == shards
    assert all((out / n).read_bytes() == (oracle / n).read_bytes() for n in shards if n != "prepare.toml")
    assert (out / "prepare.toml").read_text() == (oracle / "prepare.toml").read_text().replace(str(oracle), str(out))


@pytest.mark.slow
def test_train_checkpoint_past_the_file_size_limit(tmp_path, data, init, preloaded):  # noqa: F811
    """A resumed run whose step-6 checkpoint fails in optimizer.pt (torch's writer says only 'unexpected pos'):
    one line naming the checkpoints folder and the limit; step 3 is kept and verifies, no temp folder; resumed
    again without the limit, step 6 holds the model an uninterrupted run ends with."""
    oracle, run = tmp_path / "oracle", tmp_path / "run-a"
    base = ["train", "--data", data, "--init", init, *TRAIN, "--save-every", "3"]
    here(*base, "--out", oracle)
    here(*base, "--out", run, "--stop-after", "3")
    # model.safetensors (340 KB) fits, optimizer.pt not
    r = forked(preloaded, 500_000, *base, "--out", run, "--resume", "auto")
    one_error(r, "cannot save step 6", str(run / "checkpoints"), "file too large", "ulimit -f: 500,000 bytes",
              "step-00000003 is kept")
    assert [s for s, _ in list_checkpoints(run)] == [3] and verify_checkpoint(run / "checkpoints" / "step-00000003")
    assert leftovers(run) == []
    here(*base, "--out", run, "--resume", "auto")
    same_tensors(run / "checkpoints" / "step-00000006" / "model.safetensors",
                 oracle / "checkpoints" / "step-00000006" / "model.safetensors")


@pytest.mark.slow
def test_train_metrics_and_config_past_the_file_size_limit(tmp_path, data, init, preloaded):  # noqa: F811
    """metrics.jsonl past the limit mid-run, then the run's config.toml: one line naming the file (not a
    traceback of the write and then of closing the file); the same command without the limit starts over and
    logs the losses of an uninterrupted run."""
    oracle, run = tmp_path / "run-o", tmp_path / "run-a"  # names of one length: config.toml holds --out
    base = ["train", "--data", data, "--init", init, *TRAIN, "--save-every", "0"]
    here(*base, "--out", oracle)
    limit = (oracle / "config.toml").stat().st_size + 20  # config.toml fits, six steps' lines do not, six steps do not
    assert (oracle / "metrics.jsonl").stat().st_size > limit
    one_error(forked(preloaded, limit, *base, "--out", run), str(run / "metrics.jsonl"), "file too large",
              f"{limit:,} bytes")
    assert list_checkpoints(run) == [] and leftovers(run) == []
    one_error(forked(preloaded, 100, *base, "--out", tmp_path / "run-b"), str(tmp_path / "run-b" / "config.toml"),
              "file too large")
    assert not (tmp_path / "run-b").exists()
    here(*base, "--out", run)
    assert [m["loss"] for m in read_metrics(run)] == [m["loss"] for m in read_metrics(oracle)]
    same_tensors(run / "checkpoints" / "step-00000006" / "model.safetensors",
                 oracle / "checkpoints" / "step-00000006" / "model.safetensors")


@pytest.mark.slow
def test_resume_rewriting_metrics_past_the_file_size_limit(tmp_path, data, init, preloaded):  # noqa: F811
    """A resume rewrites metrics.jsonl (the steps after its checkpoint dropped) past the limit: one line naming
    the file and the limit; metrics.jsonl and the checkpoint are as they were, no temp file; resumed again
    without the limit, the run ends with the lines it had and the steps after them."""
    run = tmp_path / "run"
    base = ["train", "--data", data, "--init", init, *TRAIN, "--save-every", "5", "--out", run]
    here(*base, "--stop-after", "5")
    before = (run / "metrics.jsonl").read_bytes()
    limit = (run / "config.toml").stat().st_size + 20  # the resume's config.toml fits, the metrics do not
    assert len(before) > limit
    one_error(forked(preloaded, limit, *base, "--resume", "auto"), str(run / "metrics.jsonl"), "file too large",
              f"{limit:,} bytes")
    assert (run / "metrics.jsonl").read_bytes() == before and leftovers(run) == []
    assert [s for s, _ in list_checkpoints(run)] == [5] and verify_checkpoint(run / "checkpoints" / "step-00000005")
    here(*base, "--resume", "auto")
    assert (run / "metrics.jsonl").read_bytes().startswith(before)
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_demo_config_past_the_file_size_limit(tmp_path):
    """demo.toml, the demo's first file, past the limit: one line naming the folder; nothing written in it."""
    out = tmp_path / "demo"
    one_error(lcft(100, "demo", "--out", out, "--no-progress"), str(out), "file too large")
    assert not out.exists() or os.listdir(out) == []


@pytest.mark.slow
def test_train_into_a_read_only_checkpoints_folder(tmp_path, data, init, preloaded):  # noqa: F811
    """The run folder may be written but its checkpoints/ may not: the save is one line naming that folder, the
    earlier checkpoint kept."""
    run = tmp_path / "run"
    base = ["train", "--data", data, "--init", init, *TRAIN, "--save-every", "3", "--out", run]
    here(*base, "--stop-after", "3")
    (run / "checkpoints").chmod(0o555)
    try:
        r = preloaded.run(["-m", "lcft", *map(str, base), "--resume", "auto"], env=_env(), unprivileged=True)
    finally:
        (run / "checkpoints").chmod(0o755)
    one_error(r, "cannot save step 6", str(run / "checkpoints"), "Permission denied")
    assert [s for s, _ in list_checkpoints(run)] == [3] and leftovers(run) == []


@pytest.mark.slow
def test_train_pruning_a_read_only_checkpoint_warns_and_goes_on(tmp_path, data, init, preloaded):  # noqa: F811
    """--keep-last 2 over a checkpoint whose files may not be deleted: the run finishes (exit 0) with one warning
    naming the folder left behind, where it said nothing before."""
    run = tmp_path / "run"
    base = ["train", "--data", data, "--init", init, *TRAIN, "--save-every", "1", "--keep-last", "2", "--out", run]
    here(*base, "--stop-after", "2")
    (run / "checkpoints" / "step-00000001").chmod(0o555)
    try:
        r = preloaded.run(["-m", "lcft", *map(str, base), "--resume", "auto", "--stop-after", "1"], env=_env(),
                          unprivileged=True)
    finally:
        (run / "checkpoints" / ".tmp-pruned-step-00000001").chmod(0o755)
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    left = run / "checkpoints" / ".tmp-pruned-step-00000001"
    assert r.returncode == 0 and len(warnings) == 1, r.stderr[-3000:]
    assert warnings[0].startswith(f"warning: cannot remove the pruned checkpoint {left}: [Errno 13] Permission "
                                  "denied"), warnings
    assert sorted(os.listdir(run / "checkpoints")) == [left.name, "step-00000002", "step-00000003"]


def test_prepare_again_beside_a_leftover_it_cannot_remove_warns(tmp_path):
    """The same `lcft prepare windows` again over its finished folder, beside a `.partial/` (a killed run of these
    options) whose files may not be deleted: still nothing to do (exit 0) and one warning naming the folder kept
    and why (it had been removed with errors ignored: its disk space kept without a word)."""
    out = tmp_path / "out"
    args = ["prepare", "windows", "--fasta", LAMBDA, "--length", "2048", "--train", "gi|9626243|ref|NC_001416.1|",
            "--eval", "", "--out", out]
    here(*args)
    partial = out / ".partial"
    partial.mkdir()
    (partial / "train_000.bin").write_bytes(b"\0" * 4096)  # (any name: what a killed run wrote)
    partial.chmod(0o555)
    try:
        r = unprivileged([sys.executable, "-m", "lcft", *map(str, args)])
    finally:
        partial.chmod(0o755)
    assert r.returncode == 0 and "nothing to do" in r.stdout + r.stderr, r.stderr[-3000:]
    assert r.stderr.splitlines()[:1] == [
        f"warning: cannot remove {partial}, left by an earlier run of these options: [Errno 13] Permission denied: "
        "'train_000.bin'; its disk space stays in use until it is removed (each run over this folder tries again)"]
    assert os.listdir(partial) == ["train_000.bin"]
    here(*args)  # once it may be: removed
    assert not partial.exists()


CLEAR = "import sys; from lcft.evaluate.store import clear; clear(sys.argv[1], print)"


def test_eval_losses_that_cannot_be_removed_after_the_report_are_a_warning(tmp_path):
    """The kept losses of a finished evaluation (`.partial/`) whose files may not be deleted: one warning naming
    them and why (they had been removed with errors ignored: their disk space kept without a word)."""
    partial = tmp_path / "report" / ".partial"
    partial.mkdir(parents=True)
    (partial / "0123.losses").write_bytes(b"\0" * 4096)
    partial.chmod(0o555)
    try:
        r = unprivileged([sys.executable, "-c", CLEAR, str(tmp_path / "report")])
    finally:
        partial.chmod(0o755)
    assert r.returncode == 0 and r.stdout == (
        f"warning: cannot remove the finished evaluation's {partial}: [Errno 13] Permission denied: '0123.losses'; its "
        "disk space stays in use until it is removed (the next evaluation into this folder tries again)\n"), r.stderr
    assert os.listdir(partial) == ["0123.losses"]
