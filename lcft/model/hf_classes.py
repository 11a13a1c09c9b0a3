"""Which model class names transformers ships, read from its installed auto-mapping source with `ast` (never
imported: a plain import costs seconds), so a config.json's custom class can be told from another family's."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.cache
def shipped_classes() -> dict[str, str]:
    """{class name: model_type} for every class in transformers' auto mappings; {} without transformers."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return {}
    source = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto" / "modeling_auto.py"
    if not source.is_file():
        return {}
    out: dict[str, str] = {}
    for node in ast.parse(source.read_text()).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.endswith("_MAPPING_NAMES") and isinstance(node.value, ast.Call)
                and node.value.args):
            continue
        try:
            pairs = ast.literal_eval(node.value.args[0])
        except ValueError:  # a mapping built from code, not a literal list
            continue
        for model_type, names in pairs:
            for name in (names,) if isinstance(names, str) else names:
                out.setdefault(name, model_type)
    return out
