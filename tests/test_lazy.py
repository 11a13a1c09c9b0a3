"""What a process imports only when it uses it: torch.distributed.checkpoint, DTensor and FSDP (with sympy, which
they import) and torch._dynamo are imported by sharded runs and checkpoints only, so importing the trainer, the
evaluator or the export imports none of them; and lcft.lazy.is_loaded_instance, the type check that needs no
import."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from lcft.lazy import is_loaded_instance

ROOT = Path(__file__).resolve().parents[1]
# What a sharded run or checkpoint needs, and torch imports at least 1 s of (sympy, FSDP and DTensor with each).
SHARDED_ONLY = ("torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.fsdp", "torch._dynamo",
                "sympy", "lcft.checkpoint.dcp", "lcft.parallel.fsdp")
ENTRIES = ("lcft.train.trainer", "lcft.evaluate.runner", "lcft.checkpoint.export", "lcft.launch.__main__",
           "lcft.launch.jobs", "lcft.checkpoint.reader", "lcft.checkpoint.resume", "lcft.parallel.parallelize",
           "lcft.train.sharded", "lcft.cli.app")


def _fresh(code: str, cwd: Path = ROOT) -> list[str]:
    """Run `code` in a fresh interpreter; the SHARDED_ONLY modules it imported."""
    code += f"\nimport json, sys\nprint(json.dumps([m for m in {SHARDED_ONLY!r} if m in sys.modules]))\n"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_importing_the_entry_points_imports_no_sharded_only_module():
    assert _fresh("import torch\n" + "\n".join(f"import {m}" for m in ENTRIES)) == []


def test_is_loaded_instance_checks_only_a_class_already_imported(monkeypatch):
    name = "lcft_test_not_imported_module"
    assert not is_loaded_instance(object(), name, "Thing") and name not in sys.modules  # nothing imported
    module = types.ModuleType(name)
    module.Thing = type("Thing", (), {})
    monkeypatch.setitem(sys.modules, name, module)
    assert is_loaded_instance(module.Thing(), name, "Thing") and not is_loaded_instance(object(), name, "Thing")
    with pytest.raises(AttributeError):  # a misspelt class is an error, not a silent False
        is_loaded_instance(object(), name, "Thign")
