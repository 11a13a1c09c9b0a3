"""Size limits of the library's code: no file over 400 lines, no function over 60 lines (Triton kernels aside)."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lcft"
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
