"""What a process imports only when it uses it: torch.distributed.checkpoint, DTensor and FSDP (with sympy, which
they import) and torch._dynamo are imported by sharded runs and checkpoints only, so importing the trainer, the
evaluator or the export, and evaluating or exporting a plain checkpoint, imports none of them; and
lcft.lazy.is_loaded_instance, the type check that needs no import."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from lcft.lazy import is_loaded_instance
from tests.evaluate.conftest import ckpt_a, data_dir  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
# What sharded runs and checkpoints need, 1-2 s of a process's start (sympy, FSDP and DTensor with each of them);
# torch._dynamo also comes with every torch optimizer, so a training process imports it all the same.
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


def test_a_model_on_the_meta_device_imports_no_dynamo():
    """A model whose weights come from files is built on the meta device first (from_pretrained, the parameter
    shapes a config.json implies): nn.Embedding's own init imported torch._dynamo there."""
    code = ("import torch\nfrom lcft.model import Llama, preset\n"
            "with torch.device('meta'):\n    m = Llama(preset('tiny'))\n"
            "assert m.embed_tokens.weight.is_meta and m.embed_tokens.weight.requires_grad\n")
    assert _fresh(code) == []


def test_a_model_off_the_meta_device_is_initialised_as_before(monkeypatch):
    """Seeded weights are the same as those of a model built with a plain nn.Embedding (its own init, then the
    model's)."""
    import torch
    from torch import nn

    import lcft.model.llama
    from lcft.model import Llama, preset

    torch.manual_seed(3)
    got = Llama(preset("tiny")).state_dict()
    monkeypatch.setattr(lcft.model.llama, "_embedding", lambda num, dim: nn.Embedding(num, dim))
    torch.manual_seed(3)
    want = Llama(preset("tiny")).state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_evaluating_and_exporting_a_plain_checkpoint_imports_no_sharded_only_module(data_dir, ckpt_a, tmp_path):  # noqa: F811
    code = f"""if True:
        from typer.testing import CliRunner
        from lcft.cli.app import app
        for args in (["eval", "--data", {str(data_dir)!r}, "-c", {str(ckpt_a)!r}, "--out", "eval", "--max-windows",
                      "2", "--bootstrap", "1", "--quiet", "--no-progress"],
                     ["export", {str(ckpt_a)!r}, "--out", "export"]):
            r = CliRunner().invoke(app, args)
            assert r.exit_code == 0, r.output
    """
    assert _fresh(code, cwd=tmp_path) == []
    assert (tmp_path / "eval" / "eval.json").is_file() and (tmp_path / "export" / "config.json").is_file()


def test_is_loaded_instance_checks_only_a_class_already_imported(monkeypatch):
    name = "lcft_test_not_imported_module"
    assert not is_loaded_instance(object(), name, "Thing") and name not in sys.modules  # nothing imported
    module = types.ModuleType(name)
    module.Thing = type("Thing", (), {})
    monkeypatch.setitem(sys.modules, name, module)
    assert is_loaded_instance(module.Thing(), name, "Thing") and not is_loaded_instance(object(), name, "Thing")
    with pytest.raises(AttributeError):  # a misspelt class is an error, not a silent False
        is_loaded_instance(object(), name, "Thign")
