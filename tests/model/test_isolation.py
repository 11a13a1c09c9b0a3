"""lcft.model stays single-process and configuration-pure: no torch.distributed, no lcft.parallel, no
environment variables, no triton/flash-attn at import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import lcft.model

MODEL_DIR = Path(lcft.model.__file__).parent


def test_model_sources_import_no_distributed_or_parallel_and_read_no_env():
    for path in sorted(MODEL_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                assert not n.startswith(("torch.distributed", "lcft.parallel")), f"{path.name} imports {n}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("environ", "getenv", "distributed"), f"{path.name} uses .{node.attr}"
            if isinstance(node, ast.Name):
                assert node.id not in ("environ", "getenv"), f"{path.name} uses {node.id}"


def test_importing_and_running_the_model_loads_no_parallel_code():
    code = (
        "import sys, torch\n"
        "from lcft.model import Llama, preset\n"
        "from lcft.kernels import chunked_cross_entropy\n"
        "m = Llama(preset('tiny')); h = m.hidden_states(torch.randint(0, 16, (1, 64)))\n"
        "chunked_cross_entropy(h, m.lm_head_weight, torch.zeros(1, 64, dtype=torch.long))[0].backward()\n"
        "bad = [n for n in sys.modules if n.startswith(('lcft.parallel', 'triton', 'flash_attn', 'transformers'))]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
