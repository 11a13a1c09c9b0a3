"""The preloaded runner (tests/cli/preloaded.py) against a fresh interpreter: the same commands run both ways end with
the same exit status, stdout and stderr (and write the same files), so what `python -m lcft` does at start-up
(lcft/__main__.py, the CLI's) is what the tests that fork from the preloaded process see."""

from __future__ import annotations

import os
import random
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.preloaded import Preloaded, preloaded  # noqa: F401  (a fixture, by name)

# What differs from one run to the next whichever way it starts: a progress bar's rate (right-aligned) and time.
TIMINGS = re.compile(r" *\d+(\.\d+)? [kMG]?bp/s|\d+:\d\d:\d\d")


def _fasta(path: Path) -> Path:
    """A small FASTA of chr2 and chr22 (5,000 bases each, soft-masked in part)."""
    rng = random.Random(0)
    path.write_text("".join(f">{name}\n{''.join(rng.choice('ACGTacgtN') for _ in range(5000))}\n"
                            for name in ("chr2", "chr22")))
    return path


def _both(preloaded: Preloaded, argv: list[str], env: dict[str, str], out: Path | None = None,  # noqa: F811
          ) -> tuple[list[object], dict[str, bytes]]:
    """`python ARGV` fresh, then forked from the preloaded process, each into a new `out` when given: their exit
    status, stdout and stderr (timings masked), and the files each wrote (the same, or the second's '?')."""
    runs, files = [], {}
    for how in ("fresh", "preloaded"):
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
        if how == "fresh":
            r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120,
                               stdin=subprocess.DEVNULL)
        else:
            r = preloaded.run(argv, env=env, timeout=120)
        runs.append([r.returncode, r.stdout, TIMINGS.sub("T", r.stderr)])
        wrote = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))} if out else {}
        files = wrote if how == "fresh" else {k: v if wrote.get(k) == v else b"?" for k, v in wrote.items()}
        runs[-1].append(sorted(wrote))
    return runs, files


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """The environment of both runs: this one's, the test's own cache and the package first on the path."""
    root = str(Path(__file__).resolve().parents[2])
    return dict(os.environ, LCFT_CACHE=str(tmp_path / "cache"), PYTHONPATH=root, COLUMNS="100")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["prepare", "windows", "--help"]])
def test_help_is_the_same_both_ways(preloaded, env, argv):  # noqa: F811
    (fresh, forked), _ = _both(preloaded, ["-m", "lcft", *argv], env)
    assert fresh == forked and fresh[0] == 0 and fresh[1], fresh


def test_a_user_error_is_the_same_both_ways(preloaded, env, tmp_path):  # noqa: F811
    argv = ["-m", "lcft", "prepare", "windows", "--fasta", str(tmp_path / "missing.fa"), "--out", str(tmp_path / "w")]
    (fresh, forked), _ = _both(preloaded, argv, env)
    assert fresh == forked, (fresh, forked)
    assert fresh[0] == 1 and fresh[1] == "" and fresh[2].startswith("error: FASTA not found: ")
    assert fresh[2].count("\n") == 1, fresh[2]


def test_a_command_that_writes_is_the_same_both_ways(preloaded, env, tmp_path):  # noqa: F811
    out = tmp_path / "w"
    argv = ["-m", "lcft", "prepare", "windows", "--fasta", str(_fasta(tmp_path / "g.fa")), "--out", str(out),
            "--train", "chr2", "--eval", "chr22", "--length", "1K"]
    (fresh, forked), files = _both(preloaded, argv, env, out)
    assert fresh == forked, (fresh, forked)
    assert fresh[0] == 0 and f"wrote {out / 'manifest.json'}" in fresh[1], fresh
    assert "manifest.json" in files and "train.bin" in files and b"?" not in files.values(), sorted(files)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_process_ended_by_a_signal_is_the_same_both_ways(preloaded, env, signal_name):  # noqa: F811
    """A stop signal at its default disposition (SIGTERM: killed; SIGINT: KeyboardInterrupt's traceback, then
    killed by it as Python does)."""
    script = f"import os, signal\nos.kill(os.getpid(), signal.{signal_name})\nimport time\ntime.sleep(5)"
    (fresh, forked), _ = _both(preloaded, ["-c", script], env)
    assert fresh[:2] == forked[:2] and fresh[0] < 0, (fresh, forked)
    assert fresh[2] == forked[2], (fresh[2], forked[2])


def test_a_child_imports_huggingface_hub_under_its_own_environment(preloaded, tmp_path):  # noqa: F811
    """huggingface_hub reads its settings at import: a preloaded process that had imported it would hand each child
    the settings of its own start, not those of the child's environment."""
    script = ("import sys\nprint('huggingface_hub' in sys.modules)\nfrom huggingface_hub import constants\n"
              "print(constants.HF_HOME, constants.ENDPOINT, constants.HF_HUB_OFFLINE)")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    got = preloaded.run(["-c", script], env=env)
    assert got.returncode == 0 and got.stdout == f"False\n{tmp_path / 'hf'} http://127.0.0.1:9 True\n", got


def test_a_child_has_its_working_folder_and_address_space(preloaded, tmp_path):  # noqa: F811
    """`cwd` and `address_space` (RLIMIT_AS) apply to the child alone, its file-size limit beside them."""
    script = ("import os, resource\nprint(os.getcwd(), resource.getrlimit(resource.RLIMIT_AS)[0], "
              "resource.getrlimit(resource.RLIMIT_FSIZE)[0])")
    got = preloaded.run(["-c", script], address_space=5 << 30, limit=1 << 20, cwd=tmp_path)
    assert got.returncode == 0 and got.stdout == f"{tmp_path} {5 << 30} {1 << 20}\n", got
    got = preloaded.run(["-c", script])
    ours = [resource.getrlimit(which)[0] for which in (resource.RLIMIT_AS, resource.RLIMIT_FSIZE)]
    assert got.stdout == f"{os.getcwd()} {ours[0]} {ours[1]}\n", got  # (the next child's: none of the last one's)
