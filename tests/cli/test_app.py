"""The CLI shell: help lists every command, --version works."""

import subprocess
import sys

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


def test_import_lcft_does_not_import_heavy_optional_modules():
    code = "import sys, lcft, lcft.kernels, lcft.cli.app; print('triton' in sys.modules, 'flash_attn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"
