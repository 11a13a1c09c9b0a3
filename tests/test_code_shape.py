"""Shape rules of the library's code: no file over 400 lines, no function over 60 lines (Triton kernels aside), and
ruff clean under ruff.toml (which asks type hints of every function in the package)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lcft"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _is_triton_jit(node: ast.AST) -> bool:
    """A function decorated with triton.jit / @jit (or a factory that defines such kernels)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def _defines_kernels(node: ast.AST) -> bool:
    return _is_triton_jit(node) or any(_is_triton_jit(n) for n in ast.walk(node) if n is not node)


def _library_files() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py"))


def test_no_library_file_over_the_line_limit() -> None:
    long = {str(p.relative_to(LIB.parent)): n for p in _library_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_the_line_limit() -> None:
    long = {}
    for p in _library_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _defines_kernels(node):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(LIB.parent)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_limits_can_fail(tmp_path: Path) -> None:
    """The checker sees a long function and exempts a Triton kernel factory."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    long_fn = ast.parse(f"def f():\n{body}\n").body[0]
    kernel = ast.parse(f"def g():\n    @triton.jit\n    def k():\n{body.replace('    ', '        ')}\n").body[0]
    assert long_fn.end_lineno - long_fn.lineno + 1 > MAX_FUNCTION_LINES and not _defines_kernels(long_fn)
    assert _defines_kernels(kernel)


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the dev extra)")
    return subprocess.run([ruff, "check", "--no-cache", *args], cwd=cwd, capture_output=True, text=True)


def test_the_tree_is_ruff_clean() -> None:
    got = _ruff(".")
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]


def test_ruff_asks_type_hints_of_the_package(tmp_path: Path) -> None:
    """Under the tree's ruff.toml a package function without hints fails; the same in tests/ passes."""
    for folder in ("lcft", "tests"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "ruff.toml").write_text((ROOT / "ruff.toml").read_text())
    got = _ruff("lcft", cwd=tmp_path)
    assert got.returncode == 1 and "ANN001" in got.stdout and "ANN201" in got.stdout, got.stdout
    assert _ruff("tests", cwd=tmp_path).returncode == 0
