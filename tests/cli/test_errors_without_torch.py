"""User errors of `lcft train`, `lcft eval` and `lcft export` that need no torch to find (a missing or wrong folder,
launch sizes that do not divide, an --out the command may not write) are one line and exit 1 before torch is
imported: they answer as fast as `lcft --help` (BENCHMARKS.md, Starting the command line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli.preloaded import Preloaded
from tests.evaluate.conftest import data_dir  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
# In a fresh interpreter: the command line as `lcft ARGS` runs it, then whether torch was imported.
RUN = """
import json, sys
from lcft.cli.app import app
try:
    app(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def model_folder(path: Path) -> Path:
    """A folder lcft locates as an HF model folder (its config.json); nothing in it is read before the errors
    below."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def weighted_folder(path: Path) -> Path:
    """A model folder with a model.safetensors (a header declaring no tensor): what an export into a folder holding
    an export reads of it, its files and the dtype their headers declare, is there to read."""
    model_folder(path)
    (path / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    return path


def exported_folder(path: Path, record: dict) -> Path:
    """A complete export (config.json, its lcft.json recording `record` and no file)."""
    model_folder(path)
    (path / "lcft.json").write_text(json.dumps({"export": {**record, "files": {}}}))
    return path


def run_folder(path: Path) -> Path:
    """A run folder holding a checkpoint (its folder name is all a new run's check looks at)."""
    (path / "checkpoints" / "step-00000002").mkdir(parents=True)
    return path


def cases(data: Path, tmp: Path) -> list[tuple[list[str], str]]:
    """(arguments, what the one error line says) of each user error."""
    missing, model, out = tmp / "missing", model_folder(tmp / "model"), tmp / "out"
    from lcft import __version__
    from lcft.checkpoint.export_out import model_sha256

    source = weighted_folder(tmp / "source")
    exported = exported_folder(tmp / "exported", {"source_sha256": "0" * 64, "dtype": None})  # another checkpoint's
    # of `source`, but in bfloat16: its weights' headers are read to tell the dtype an export without --dtype writes
    cast = exported_folder(tmp / "cast", {"source_sha256": model_sha256(source), "dtype": "bfloat16",
                                          "lcft": __version__})
    train = ["train", "--data", str(data), "--out", str(out)]
    return [
        (["eval", "--data", str(missing), "-c", str(missing), "--out", str(out)],
         f"windows folder not found: {missing}"),
        (["eval", "--data", str(missing), "-c", str(missing), "--out", str(out), "--nproc", "2"],
         "windows folder not found"),
        (["eval", "--data", str(tmp), "-c", str(model), "--out", str(out)], "no manifest.json"),
        (["eval", "--data", str(data), "-c", str(missing), "--out", str(out)], f"checkpoint not found: {missing}"),
        (["eval", "--data", str(data), "-c", str(model), "--out", str(model / "report")],
         "is the checkpoint"),
        (["eval", "--data", str(data), "-c", str(model), "--out", str(data)], "is --data"),
        (["eval", "--data", str(data), "-c", str(model), "--out", str(out), "--nproc", "4", "--cp", "3"],
         "world size 4 is not divisible by cp=3"),
        (["eval", "--data", str(data), "-c", str(model), "--out", str(out), "--cp", "2"],
         "world size 1 is not divisible by cp=2"),
        (["train", "--out", str(out)], "give the prepared data folder (--data)"),
        (["train", "--data", str(missing), "--out", str(out)], f"windows folder not found: {missing}"),
        (["train", "--data", str(missing), "--out", str(out), "--nproc", "2"], "windows folder not found"),
        ([*train, "--nproc", "4", "--cp", "3"], "world size 4 is not divisible by cp=3"),
        ([*train, "--nproc", "2", "--global-batch", "3"], "--global-batch 3 is not a multiple of --micro-batch x "
         "data-parallel ranks (1 x 2): 2 or 4 would split"),
        (["train", "--data", str(data), "--out", str(model), "--nproc", "2"], "is a model folder"),
        (["train", "--data", str(data), "--out", str(model)], "is a model folder"),
        (["train", "--data", str(data), "--out", str(data)], "is --data"),
        ([*train, "--init", str(missing)], f"checkpoint not found: {missing}"),
        (["train", "--data", str(data), "--out", str(run_folder(tmp / "run"))], "already holds checkpoints"),
        (["export", str(missing), "--out", str(out)], f"checkpoint not found: {missing}"),
        (["export", str(model), "--out", str(model / "hf")], "is the checkpoint"),
        (["export", str(model), "--out", str(out), "--dtype", "int8"], "--dtype: 'int8' is not one of"),
        (["export", str(source), "--out", str(exported)], "already holds an export of another checkpoint"),
        (["export", str(source), "--out", str(cast)], "already holds an export of another checkpoint, --dtype"),
    ]


def test_user_errors_answer_before_torch_is_imported(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """Each in its own process, forked from one that imported the command line alone (what RUN imports first; one
    start-up, not one per case): exit code 1, one `error:` line naming the mistake, torch never imported; nothing
    written (the output folder named is not created)."""
    monkeypatch.setenv("COLUMNS", "200")  # before the spawn: its console is made before the forks
    server = Preloaded(preload=("lcft.cli.app",))
    failed = []
    try:
        for args, needle in cases(data_dir, tmp_path):
            r = server.run(["-c", RUN, *args], env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300)
            got = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
            lines = r.stderr.strip().splitlines()
            one_line = len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
            if got != {"code": 1, "torch": False} or not one_line:
                failed.append((" ".join(args[:1] + [a.replace(str(tmp_path), "TMP") for a in args[1:]]), got,
                               r.stderr[-600:]))
    finally:
        server.close()
    assert not failed, "\n".join(map(str, failed))
    assert not (tmp_path / "out").exists()



def test_a_run_folder_another_train_is_writing_is_its_locks_one_line(data_dir, tmp_path):  # noqa: F811
    """A new run into a folder another `lcft train` holds (and has checkpoints in): the holder is named, not the
    checkpoints (whose advice, --resume auto, would resume a run still going); the early check leaves it to the
    lock."""
    from lcft.folder_lock import folder_lock

    run = run_folder(tmp_path / "run")
    with folder_lock(run, "lcft train"):
        r = subprocess.run([sys.executable, "-c", RUN, "train", "--data", str(data_dir), "--out", str(run)],
                           capture_output=True, text=True, cwd=tmp_path, env=os.environ | {"PYTHONPATH": str(ROOT)},
                           timeout=300)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: another `lcft train` is writing into {run} (pid "), r.stderr
