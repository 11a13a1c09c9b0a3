"""Import rules of the package: no cycle between modules, and the layering (model/kernels below parallel below
train/evaluate below launch below cli; genomics and the model independent of each other; only the CLI entry point
imports lcft.cli).

The graph is read from the sources with `ast`: module-level and function-level imports, relative imports
resolved, lazy re-export tables (`_EXPORTS = {"name": "lcft.x.y"}`) read as imports of their package.
`from pkg import name` where pkg's __init__ re-exports `name` is an edge to the module that defines it (the
__init__ is a facade, not a module of its own), and importing `pkg.sub` also runs the __init__ of every
package on the way that the importer is not itself inside. Imports under `if TYPE_CHECKING:` never run:
they count for the layering rules but not for cycles.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import lcft

ROOT = Path(lcft.__file__).parent

# what sits below every stage imports none of them
STAGES = ("lcft.model", "lcft.kernels", "lcft.genomics", "lcft.parallel", "lcft.train", "lcft.evaluate", "lcft.cli",
          "lcft.checkpoint", "lcft.launch", "lcft.plan", "lcft.recipes")
# the file helpers, below every stage; lcft.disk and lcft.pickles sit below them too
FILE_HELPERS = ("lcft.files", "lcft.hashing", "lcft.foreign_entries", "lcft.folder_lock", "lcft.umask")
# (importer prefix, forbidden target prefixes)
LAYERS = [
    # the model takes its vocabulary from its config: it never reads a tokenizer; model folders and checkpoints
    # are read and written by lcft.checkpoint, above the model: the model never imports it
    ("lcft.model", ("lcft.parallel", "lcft.train", "lcft.evaluate", "lcft.cli", "lcft.genomics", "lcft.checkpoint")),
    ("lcft.kernels", ("lcft.parallel", "lcft.train", "lcft.evaluate", "lcft.cli", "lcft.checkpoint")),
    ("lcft.parallel", ("lcft.train", "lcft.evaluate", "lcft.cli", "lcft.launch")),
    # train and evaluate are peers: what both need sits below them (lcft.parallel, lcft.units, ...); they run in
    # the process they are called in: only the CLI decides to launch
    ("lcft.train", ("lcft.evaluate", "lcft.launch")),
    ("lcft.evaluate", ("lcft.train", "lcft.launch")),
    ("lcft.genomics", ("lcft.model",)),
    # the checkpoint component (layout, saves, load, the HF folder) serves train, eval and export alike, above the
    # model and below them; it takes nothing from the parallel layout (DCP and process groups from torch directly);
    # file helpers sit below everything
    ("lcft.checkpoint", ("lcft.train", "lcft.evaluate", "lcft.cli", "lcft.parallel", "lcft.launch")),
    ("lcft.hub", STAGES),
    ("lcft.vocab", STAGES),
    ("lcft.pickles", (*STAGES, *FILE_HELPERS)),
    *[(helper, STAGES) for helper in FILE_HELPERS],
    ("lcft.lazy", ("lcft",)),  # under every package's __init__: it imports nothing of lcft
    ("lcft.disk", (*STAGES, *FILE_HELPERS)),
    ("lcft.cpus", STAGES),  # the CPUs a process may use: read by the launcher and the plan alike
]
# Only the CLI itself and `python -m lcft` may import lcft.cli.
CLI_ALLOWED = ("lcft.cli", "lcft.__main__")


@dataclass
class Edge:
    """One import: `src` needs `dst` (a module of the package), written at `line`."""

    src: str
    dst: str
    line: int
    runs: bool = True  # False under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst} (line {self.line}{'' if self.runs else ', TYPE_CHECKING'})"


@dataclass
class Module:
    """A parsed source file: its name, whether it is a package __init__, and its raw imports."""

    name: str
    is_package: bool
    tree: ast.Module
    reexports: dict[str, str] = field(default_factory=dict)  # name -> module it is imported from


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def read_modules(root: Path, top: str) -> dict[str, Module]:
    """Every .py file under root (the directory of package `top`) by dotted module name."""
    mods: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [top, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        mods[name] = Module(name, is_package, ast.parse(path.read_text(), str(path)))
    return mods


def _package_of(mod: Module) -> str:
    return mod.name if mod.is_package else mod.name.rpartition(".")[0]


def _absolute(mod: Module, node: ast.ImportFrom) -> str:
    """The absolute module name of `from <...> import` (relative levels resolved against the importer)."""
    if not node.level:
        return node.module or ""
    base = _package_of(mod).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
                    isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
                ids.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ids


def _raw_imports(mod: Module, mods: dict[str, Module]) -> list[tuple[str, str | None, int, bool]]:
    """(module, imported name or None, line, runs) of every import statement anywhere in the file."""
    typing_only = _type_checking_nodes(mod.tree)
    out: list[tuple[str, str | None, int, bool]] = []
    for node in ast.walk(mod.tree):
        runs = id(node) not in typing_only
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno, runs) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(mod, node)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub, None, node.lineno, runs) if sub in mods else (base, a.name, node.lineno, runs))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            for v in node.value.values:  # a lazy re-export table: name -> "lcft.x.y"
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    out.append((v.value, None, node.lineno, runs))
    return out


def _collect_reexports(mods: dict[str, Module]) -> None:
    """For every package __init__, which of its names come from which module (eager or lazy table)."""
    for mod in mods.values():
        if not mod.is_package:
            continue
        for node in mod.tree.body:
            if isinstance(node, ast.ImportFrom):
                base = _absolute(mod, node)
                for a in node.names:
                    mod.reexports[a.asname or a.name] = base
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                    isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
                for k, v in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        mod.reexports[k.value] = v.value


def _defining_module(pkg: str, name: str, mods: dict[str, Module]) -> str:
    """Follow re-exports from package `pkg` to the module that defines `name` (pkg itself when it does)."""
    seen = set()
    while pkg in mods and mods[pkg].is_package and name in mods[pkg].reexports and pkg not in seen:
        seen.add(pkg)
        pkg = mods[pkg].reexports[name]
        if f"{pkg}.{name}" in mods:
            return f"{pkg}.{name}"
    return pkg


def build_graph(mods: dict[str, Module], top: str) -> list[Edge]:
    """Every import edge between modules of package `top` (see the file docstring for the conventions)."""
    _collect_reexports(mods)
    edges: list[Edge] = []
    for mod in mods.values():
        for target, name, line, runs in _raw_imports(mod, mods):
            if not _within(target, top):
                continue
            dst = _defining_module(target, name, mods) if name else target
            while dst not in mods and "." in dst:  # `import lcft.x.y.attr`-like: the nearest module
                dst = dst.rpartition(".")[0]
            # Importing a.b.c runs a and a.b first, unless the importer lives inside them (already running).
            parts = dst.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in mods and not _within(mod.name, parent):
                    edges.append(Edge(mod.name, parent, line, runs))
            if dst != mod.name:
                edges.append(Edge(mod.name, dst, line, runs))
    return edges


def find_cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected groups of more than one module over the edges that run (Tarjan), sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.runs:
            graph.setdefault(e.src, set()).add(e.dst)
            graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def describe_cycle(group: list[str], edges: list[Edge]) -> str:
    """The edges inside one strongly connected group, for the assertion message."""
    inside = set(group)
    lines = sorted({str(e) for e in edges if e.runs and e.src in inside and e.dst in inside})
    return "cycle between " + ", ".join(group) + ":\n    " + "\n    ".join(lines)


def layer_violations(edges: list[Edge], top: str = "lcft") -> list[str]:
    """Every edge that breaks LAYERS or the lcft.cli rule."""
    bad = []
    for e in edges:
        for src_prefix, forbidden in LAYERS:
            src_prefix = src_prefix.replace("lcft", top, 1)
            if _within(e.src, src_prefix) and any(_within(e.dst, f.replace("lcft", top, 1)) for f in forbidden):
                bad.append(f"{e} breaks: {src_prefix} imports nothing from {', '.join(forbidden)}")
        cli = f"{top}.cli"
        if _within(e.dst, cli) and not any(_within(e.src, a.replace("lcft", top, 1)) for a in CLI_ALLOWED):
            bad.append(f"{e} breaks: no library module imports {cli}")
    return sorted(set(bad))


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return build_graph(read_modules(ROOT, "lcft"), "lcft")


def test_no_import_cycles(edges):
    cycles = find_cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(describe_cycle(g, edges) for g in cycles)


def test_layering(edges):
    bad = layer_violations(edges)
    assert not bad, "layering broken:\n" + "\n".join(bad)


def test_graph_sees_known_edges(edges):
    """The reader finds imports of every kind (otherwise the two tests above would pass on an empty graph)."""
    got = {(e.src, e.dst) for e in edges}
    assert ("lcft.__main__", "lcft.cli.app") in got
    assert ("lcft.model", "lcft.model.llama") in got  # a lazy re-export of a package with a docstring
    assert ("lcft.kernels", "lcft.kernels.loss") in got  # lazy _EXPORTS table
    assert ("lcft.train.step", "lcft.kernels.loss") in got  # `from lcft.kernels import chunked_cross_entropy`
    assert ("lcft.train.step", "lcft.parallel.apply") in {(e.src, e.dst) for e in edges if not e.runs}


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_checker_reports_cycles_and_violations(tmp_path):
    """A synthetic package with a cycle through a function-level relative import, one hidden behind a
    re-export, one under TYPE_CHECKING (not a cycle), and layering breaks."""
    _write_tree(tmp_path / "lcft", {
        "__init__.py": "",
        "model/__init__.py": "from .core import Net\n",
        "model/core.py": "class Net:\n    pass\n",
        "model/bad.py": "def f():\n    from ..train import loop\n",
        "train/__init__.py": "from lcft.train.loop import loop\n",
        "train/loop.py": "from lcft.evaluate import run\n\ndef loop():\n    pass\n",
        "evaluate/__init__.py": "_EXPORTS = {'run': 'lcft.evaluate.runner'}\n",
        "evaluate/runner.py": "def run():\n    from . import helper\n",
        "evaluate/helper.py": "from lcft.evaluate.runner import run\n",
        "parallel/__init__.py": "",
        "parallel/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lcft.train import loop\n",
        "genomics/__init__.py": "import lcft.cli.app\n",
        "cli/__init__.py": "",
        "cli/app.py": "from lcft.model import Net\n",
        "__main__.py": "from lcft.cli.app import main\n",
    })
    edges = build_graph(read_modules(tmp_path / "lcft", "lcft"), "lcft")
    assert find_cycles(edges) == [["lcft.evaluate.helper", "lcft.evaluate.runner"]]
    bad = layer_violations(edges)
    assert any(b.startswith("lcft.model.bad -> lcft.train.loop") for b in bad), bad
    assert any(b.startswith("lcft.parallel.x -> lcft.train.loop") and "TYPE_CHECKING" in b for b in bad), bad
    assert any(b.startswith("lcft.genomics -> lcft.cli.app") for b in bad), bad
    assert not any(b.startswith(("lcft.__main__", "lcft.cli.app")) for b in bad), bad
    assert ("lcft.cli.app", "lcft.model.core") in {(e.src, e.dst) for e in edges}


def test_checkpoint_layout_is_named_only_inside_lcft_checkpoint():
    """The run/checkpoint layout constants are defined, and the checksums file named, only in lcft/checkpoint/
    (everyone else imports them): a source scan."""
    defined = re.compile(r"^(CHECKPOINTS|STEP_DIR|TMP_PREFIX|STATE_DIR|RUN_CONFIG|CHECKSUMS|SUPERSEDED)\s*=", re.M)
    outside = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] == "checkpoint":
            continue
        text = path.read_text()
        outside += [f"{path.relative_to(ROOT)}: {m.group(1)} =" for m in defined.finditer(text)]
        outside += [f"{path.relative_to(ROOT)}: checksums.json"] if "checksums.json" in text else []
    assert not outside, outside
    assert "checksums.json" in (ROOT / "checkpoint" / "layout.py").read_text()  # the scan sees the real home


LAYOUT_LITERALS = ("dcp", "checksums.json", "lcft.json", ".tmp-")  # DCP_DIR, CHECKSUMS, MODEL_META, TMP_PREFIX


def _code_strings(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, value) of the string constants of a module that are not docstrings (f-string pieces included)."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_checkpoint_layout_literals_appear_only_inside_lcft_checkpoint():
    """The layout's names as string literals ("dcp", "checksums.json", "lcft.json", the temp prefix ".tmp-")
    appear only under lcft/checkpoint/: everyone else imports the constant (docstrings and prose may name them)."""
    outside, inside = [], set()
    for path in sorted(ROOT.rglob("*.py")):
        home = path.relative_to(ROOT).parts[0] == "checkpoint"
        for line, value in _code_strings(ast.parse(path.read_text())):
            if value in LAYOUT_LITERALS:
                inside.add(value) if home else outside.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert not outside, outside
    assert inside == set(LAYOUT_LITERALS)  # the scan sees each one at its home


def test_layout_literal_scan_skips_docstrings_and_sees_fstrings():
    tree = ast.parse('"""names lcft.json"""\ndef f(d):\n    """dcp"""\n    return f"{d}.tmp-", "dcp"\n')
    assert sorted(v for _, v in _code_strings(tree) if v in LAYOUT_LITERALS) == [".tmp-", "dcp"]


def _calls(path: Path) -> set[str]:
    """Names of the functions a module calls (`f(` or `x.f(`)."""
    return {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)}


def test_process_groups_come_from_the_one_device_mesh():
    """No module builds process groups by hand (`new_group`): the cp groups and FSDP's shard dimension are
    views of the one ("dp", "cp") DeviceMesh that lcft/parallel/mesh.py builds."""
    hand_made = [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py")) if "new_group" in _calls(p)]
    assert not hand_made, hand_made
    assert "init_device_mesh" in _calls(ROOT / "parallel" / "mesh.py")  # the scan sees the real home


def test_the_model_holds_no_activation_checkpointing():
    """Activation checkpointing and offload are applied from outside (lcft/parallel/activations.py)."""
    used = _calls(ROOT / "model" / "llama.py") | _calls(ROOT / "model" / "layers.py")
    assert not used & {"checkpoint", "save_on_cpu", "checkpoint_sequential"}, used
    assert "checkpoint" in _calls(ROOT / "parallel" / "activations.py")


def test_no_lazy_name_is_a_module_of_its_package():
    """A package's lazy export (`_EXPORTS`) named like one of its modules resolves to the function only until that
    module is imported: importing it sets the package's attribute to the module (`lcft.parallel.parallelize`
    became a module once something imported lcft.parallel.parallelize, and `parallelize(...)` failed)."""
    clashes = []
    for init in sorted(ROOT.rglob("__init__.py")):
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["_EXPORTS"]:
                modules = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir()}
                clashes += [f"{init.relative_to(ROOT)}: {k.value}" for k in node.value.keys
                            if isinstance(k, ast.Constant) and k.value in modules]
    assert not clashes, clashes
