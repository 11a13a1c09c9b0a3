"""What a cluster node's environment hands the CLI as it starts: a current folder deleted under the shell, a
TORCHINDUCTOR_CACHE_DIR that cannot be made, an OMP_NUM_THREADS libgomp cannot read: each one line, exit 1, before
torch loads; a blank OMP_NUM_THREADS is taken as unset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cli.preloaded import preloaded  # noqa: F401  (a fixture, by name)
from tests.evaluate.conftest import save_model

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["-m", "lcft", "plan", "--preset", "tiny", "--seq-len", "1K"]


def _one_error_line(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), (r.returncode, r.stderr)
    assert all(n in r.stderr for n in needles), r.stderr


def test_a_deleted_current_folder_is_one_line(tmp_path):
    """`cd run; rm -r ../run; lcft plan ...`: loading torch there killed the process (its MKL cannot load
    libtorch_cpu: 'Intel oneMKL FATAL ERROR', exit 2). A fresh interpreter: the preloaded one has torch loaded."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = f"import os, sys, runpy; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = {['lcft', *PLAN[2:]]!r}; " \
           "runpy.run_module('lcft', run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    _one_error_line(r, "current folder was deleted", "cd into an existing folder")


def test_a_compiler_cache_folder_that_cannot_be_made_is_one_line(preloaded, tmp_path):  # noqa: F811
    """torch makes TORCHINDUCTOR_CACHE_DIR as its compiler loads, which an export does (so do train and eval, for
    the optimizer), compiling or not: a PermissionError (here NotADirectoryError) traceback; nothing written."""
    source = save_model(tmp_path / "model", seed=0)
    (tmp_path / "file").write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "file" / "cache")}
    r = preloaded.run(["-m", "lcft", "export", str(source), "--out", str(tmp_path / "out")], env=env)
    _one_error_line(r, "TORCHINDUCTOR_CACHE_DIR=", "point it at a writable folder, or unset it")
    assert not (tmp_path / "out").exists()
    r = preloaded.run(PLAN, env=env)  # plan never loads the compiler: a cache folder it would not use is no error
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_thread_count_libgomp_cannot_read_is_one_line(preloaded, tmp_path):  # noqa: F811
    """It was a libgomp warning, and every CPU in each process of a launch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "abc"}
    _one_error_line(preloaded.run(PLAN, env=env), "OMP_NUM_THREADS='abc'", "unset it")
    r = preloaded.run(PLAN, env={**env, "OMP_NUM_THREADS": ""})
    assert r.returncode == 0 and r.stderr == "", r.stderr
