"""The CLI shell: help lists every command, --version works, a Ctrl-C while it loads ends quietly."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcft import __version__
from lcft.cli.app import app

runner = CliRunner()


def test_help_lists_commands():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("prepare", "train", "eval", "export"):
        assert cmd in r.output


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


def test_the_command_line_starts_without_torch():
    """`lcft --help`, a mistyped option and the config checks import the CLI, its config
    classes and their validation only: torch and the model libraries are imported by the commands that run
    (the packages' __init__ resolve names lazily; BENCHMARKS.md, Starting the command line)."""
    heavy = ("torch", "transformers", "accelerate", "tokenizers", "safetensors", "triton", "flash_attn", "matplotlib",
             "Bio")
    code = f"import sys, lcft, lcft.kernels, lcft.cli.app; print([m for m in {heavy!r} if m in sys.modules])"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stdout.strip() == "[]", got.stdout + got.stderr


def test_help_works_without_source_files(tmp_path):
    """An install holding only .pyc files (no source for inspect to read field docstrings from): every
    command's --help still works and lists every option."""
    import compileall
    import json
    import shutil
    from pathlib import Path

    import lcft

    pkg = shutil.copytree(Path(lcft.__file__).parent, tmp_path / "lcft", ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(pkg, legacy=True, quiet=1)  # foo.pyc beside foo.py, importable without it
    for src in pkg.rglob("*.py"):
        src.unlink()
    code = """if True:
        import json, lcft.config
        from typer.testing import CliRunner
        from lcft.cli.app import app
        cases = [["--help"], ["train", "--help"], ["eval", "--help"], ["prepare", "windows", "--help"], ["demo", "--help"]]
        runs = [CliRunner().invoke(app, args, env={"COLUMNS": "200"}) for args in cases]
        print(json.dumps([lcft.config.__file__] + [[r.exit_code, r.output] for r in runs]))
    """
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    where, *results = json.loads(r.stdout)
    assert where.endswith(".pyc")  # it really ran from the compiled copy
    for (code_, output), flag in zip(results, ("train", "--seq-len", "--checkpoint", "--max-n-frac", "--layers"),
                                     strict=True):
        assert code_ == 0 and flag in output, output


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["plan", "--help"],
                                  ["plan", "--preset", "tiny", "--seq-len", "1K", "--explain"]])
def test_output_into_a_closed_pipe_ends_quietly_as_cat_does(args):
    """`lcft ... | head -1`: the reader is gone before lcft writes (its read end closed here first, so the write
    fails every time). Typer's output (help, --version) and lcft's own (a plan) end with no traceback and no
    message, exit code 141 (128 + SIGPIPE, as `cat`), never 1 (a user error)."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "lcft", *args], stdout=write, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, ""), r.stderr[-2000:]


@pytest.mark.parametrize("args", [["--help"], ["plan", "--preset", "tiny", "--seq-len", "1K"]])
def test_a_standard_output_that_takes_no_more_is_one_line(args):
    """stdout a log file on a full disk or quota (/dev/full here): typer's help and lcft's own output (a plan) were
    a traceback ending in 'OSError: [Errno 28] No space left on device'; now one line on stderr, exit 1. With stderr
    full too, nothing is said and the exit code is the same."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "lcft", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                           env=env, timeout=120)
        assert (r.returncode, r.stderr) == (1, "error: cannot write to standard output (No space left on device): "
                                               "free space where it goes, or send it elsewhere\n"), r.stderr[-2000:]
        r = subprocess.run([sys.executable, "-m", "lcft", *args], stdout=full, stderr=full, env=env, timeout=120)
        assert r.returncode == 1


INTERRUPT_WHILE_LOADING = """
import os, signal, sys
class _Interrupt:  # a Ctrl-C that arrives while the CLI's imports run (they take a second or more)
    def find_spec(self, name, path=None, target=None):
        if name == "typer":  # imported by lcft.cli.app only
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, _Interrupt())
"""


def _console_script() -> str:
    """The `lcft` command's entry point as setup.cfg declares it (module:function)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    [line] = [x for x in cfg["options.entry_points"]["console_scripts"].splitlines() if x.strip().startswith("lcft")]
    return line.split("=", 1)[1].strip()


@pytest.mark.parametrize("entry", ["python -m lcft", "lcft"])
def test_ctrl_c_while_the_command_line_loads_exits_130_without_a_traceback(tmp_path, entry):
    """SIGINT sent by the process to itself as `import typer` starts (a sitecustomize on the path: the same point
    every run). It was a KeyboardInterrupt traceback and death by SIGINT; now `interrupted`, exit 130, as a Ctrl-C
    inside a command. `lcft` runs the console script's entry point as the installed script does."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_WHILE_LOADING)
    module, func = _console_script().split(":")
    cmd = ([sys.executable, "-m", "lcft", "--version"] if entry == "python -m lcft" else
           [sys.executable, "-c", f"import sys; sys.argv = ['lcft', '--version']; from {module} import {func}; {func}()"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "interrupted\n"), (r.returncode, r.stderr[-2000:])

