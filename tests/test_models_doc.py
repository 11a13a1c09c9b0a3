"""docs/models.md and README's plan table: what benchmarks/models_table.py writes from the published config.json
files, every row loaded through lcft's reader (or listed refused with its message), every printed train command
planned again through `lcft plan`'s CLI, and the fields held for a model not in ../shared/published rebuilding its
published file's sha256. Also the names README and docs/*.md give: every module named in docs/design.md, every path
and `lcft.x.y` name found in the tree, every `lcft ...` command line made of its command's options."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from lcft.cli.app import app
from lcft.model.hf import config_from_hf
from lcft.model.hf_families import METADATA

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("models_table", ROOT / "benchmarks" / "models_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    if not mod.SHARED.is_dir():
        pytest.skip(f"published files not found at {mod.SHARED}")
    return mod


def test_docs_are_what_the_script_writes(table):
    assert (ROOT / "docs" / "models.md").read_text() == table.document(), \
        "docs/models.md is stale: run python benchmarks/models_table.py"
    readme = (ROOT / "README.md").read_text()
    assert readme == table.readme_text(readme), "README's plan table is stale: run python benchmarks/models_table.py"
    assert table.readme_table() in readme and "GENERator-3B-shaped" not in readme


def test_every_row_loads_through_lcfts_reader_or_shows_its_refusal(table):
    doc = (ROOT / "docs" / "models.md").read_text()
    rows = table.loaded()
    assert {m.name for m, *_ in rows} == {"GENERator-eukaryote-1.2B", "GENERator-eukaryote-3B", "METAGENE-1",
                                          "GenomeOcean-500M", "GenomeOcean-4B"}
    for m, model, notes, refusal in rows:
        d = table.config_json(m)
        if model is None:
            assert refusal and f"refused: {refusal}" in doc
            continue
        assert config_from_hf(d) == model and not refusal
        row = next(line for line in doc.splitlines() if line.startswith(f"| {m.name} | {d['model_type']} / "))
        assert f"| {model.rope_theta:g} |" in row and f"{model.max_position_embeddings:,} tokens" in row
        assert all(f"`note: {n}`" in doc for n in notes)
    gen3b = next(model for m, model, *_ in rows if m.name == "GENERator-eukaryote-3B")
    # the published 3B model, not README's former hand-made shape (28 layers, 8 KV heads, intermediate 8192)
    assert (gen3b.num_hidden_layers, gen3b.num_key_value_heads, gen3b.intermediate_size) == (30, 4, 8448)
    assert "not found: Genos" in doc and "not found: GenomeOcean 100M" in doc


# The published weights of GenomeOcean (bf16, 2 bytes a parameter) as github.com/tcztzy/evo.cpp @ c281681 records
# them: 4B, the total_size of model.safetensors.index.json and its tensor count
# (tools/generate_geneb_genome_ocean_4b_upstream_oracle.py); 500M, the size of its one model.safetensors
# (configs/evidence/geneb-genome-ocean-500m.json), which adds 8 bytes and a JSON header to the data.
GENOMEOCEAN_4B_BYTES, GENOMEOCEAN_4B_TENSORS = 8_506_349_568, 219
GENOMEOCEAN_500M_FILE = 1_082_234_168


def test_held_genomeocean_fields_give_the_published_weights(table):
    """The held fields of a config.json not seen whole, checked against the published weights: lcft's model built
    from them has the 4B's parameter and tensor counts exactly, and the 500M's data fits its file with a header
    of a few KiB."""
    import torch

    from lcft.model import Llama

    def built(name: str) -> Llama:
        m = next(m for m in table.MODELS if m.name == name)
        with torch.device("meta"):
            return Llama(config_from_hf(table.config_json(m)))

    big = built("GenomeOcean-4B")
    assert (2 * big.num_parameters(), len(big.state_dict())) == (GENOMEOCEAN_4B_BYTES, GENOMEOCEAN_4B_TENSORS)
    small = built("GenomeOcean-500M")
    header = GENOMEOCEAN_500M_FILE - 8 - 2 * small.num_parameters()
    assert 100 * len(small.state_dict()) < header < 64 << 10, header


def test_held_fields_rebuild_the_published_config_json(table):
    """GENERator-eukaryote-1.2B's config.json is the 3B file with three counts changed: substituting the table's
    values into the published 3B text must give the 1.2B file's published sha256 byte for byte."""
    m = next(m for m in table.MODELS if m.name == "GENERator-eukaryote-1.2B")
    text = (table.SHARED / "generator-eukaryote-3b-base" / "config.json").read_text()
    published = json.loads(text)
    assert set(m.fields) <= set(published) and set(published) - set(m.fields) <= METADATA  # only what lcft reads
    changed = {k: v for k, v in m.fields.items() if published[k] != v}
    assert set(changed) == {"hidden_size", "intermediate_size", "num_hidden_layers"}
    for key, value in changed.items():
        old = f'"{key}": {json.dumps(published[key])},'
        assert text.count(old) == 1
        text = text.replace(old, f'"{key}": {json.dumps(value)},')
    assert hashlib.sha256(text.encode()).hexdigest() == m.sha256


def _plan_argv(line: str, init: Path) -> list[str]:
    """A printed train command as `lcft plan` options: --init pointed at a folder holding the config.json, the
    GPU memory from its trailing comment, and the data and run folders (which plan does not read) left out."""
    command, _, comment = line.partition("#")
    words = shlex.split(command)[2:]
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("--data", "--out", "--init"):
            skip = True
            out += ["--init", str(init)] if w == "--init" else []
            continue
        out.append(w)
    return ["plan", *out, "--gpu-memory", comment.split(" x ")[1].strip()]


def test_every_printed_train_command_fits_when_lcft_plan_reads_it(table, tmp_path):
    """The commands are planned again by the `lcft plan` CLI from a config.json folder (the path a user takes):
    each fits, with the figure the layout table gives."""
    doc = (ROOT / "docs" / "models.md").read_text()
    runner = CliRunner()
    for m, model, _, _ in table.loaded():
        folder = tmp_path / m.slug
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(table.config_json(m)))
        lines = [c for c in table.commands(m, model) if c.startswith("lcft train")]
        assert len(lines) == len(table.LENGTHS) * len(table.GPUS)
        for line in lines:
            assert line in doc
            result = runner.invoke(app, _plan_argv(line, folder))
            assert result.exit_code == 0, result.output
            assert "verdict: fits" in result.output, (line, result.output)
            total = float(re.search(r"total\s+([\d.]+) GiB", result.output).group(1))
            seq, gpu = re.search(r"--seq-len (\S+)", line).group(1), line.split(" x ")[-1]
            want = f"| {m.name} | {seq} | {table.NPROC} x {gpu} |"
            row = next(r for r in doc.splitlines() if r.startswith(want))
            # the CLI prints two decimals, the table one (from the unrounded figure): 71.85 may be 71.9 there
            assert row.split("|")[-3].strip() == "yes" and abs(float(row.split("|")[-2]) - total) <= 0.0501, (row, total)


def test_every_printed_prepare_command_parses_as_lcft_prepare_windows(table):
    windows = typer.main.get_command(app).commands["prepare"].commands["windows"]
    for m, model, _, _ in table.loaded():
        lines = [c for c in table.commands(m, model) if c.startswith("lcft prepare windows")]
        assert len(lines) == len(table.LENGTHS)
        for line in lines:
            params = windows.make_context("windows", shlex.split(line)[3:]).params  # unknown flags raise
            assert params["tokenizer"] == m.hub and params["length"] in ("512K", "1M")


# The names the docs give: every module named in docs/design.md, every path and `lcft.x.y` name the docs use
# found in the tree, every `lcft ...` command line they show made of options of its command.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md"]


def test_design_names_every_module_of_the_package():
    """Each module by its file name where no other module has it, else by its folder too (`cli/export.py`,
    `lcft.checkpoint.export`, or the folder earlier in the name's paragraph): one `config.py` named is
    not every config.py."""
    design = (ROOT / "docs" / "design.md").read_text()
    modules = [p.relative_to(ROOT / "lcft") for p in sorted((ROOT / "lcft").rglob("*.py")) if p.name != "__init__.py"]
    shared = {m.name for m in modules if sum(n.name == m.name for n in modules) > 1}
    missing = []
    for rel in modules:
        dotted = ".".join(("lcft", *rel.with_suffix("").parts))
        named = rf"\b{re.escape(rel.as_posix())}\b|\b{re.escape(dotted)}\b"
        if rel.name not in shared:
            named += rf"|\b{re.escape(rel.name)}\b"
        elif len(rel.parts) > 1:
            named += rf"|{re.escape(rel.parent.as_posix())}/`?(?:[^\n]|\n(?!\n))*?\b{re.escape(rel.name)}\b"
        if not re.search(named, design):
            missing.append(f"lcft/{rel.as_posix()}")
    assert not missing, f"modules docs/design.md does not name: {missing}"


def _top_level_names(path: Path) -> set[str]:
    """What a module defines at its top level (functions, classes, assignments, imports, lazy exports)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(getattr(t, "id", "") == "_EXPORTS" for t in targets) and isinstance(node.value, ast.Dict):
                names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(dotted: str) -> bool:
    """`lcft.a.b.c`: the longest prefix that is a module of the tree, then a name it defines at its top level."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:k])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[k:]
            return not rest or rest[0] in _top_level_names(module) or (base / f"{rest[0]}.py").is_file()
    return False


def test_every_path_and_lcft_name_the_docs_give_exists():
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for path in set(re.findall(r"(?<![\w/.-])((?:lcft|tests|benchmarks|docs)/[\w/-]*\w\.(?:py|md|jsonl?|sh))\b", text)):
            if not (ROOT / path).is_file():
                wrong.append(f"{doc.name}: {path}")
        for name in set(re.findall(r"(?<![\w/.-])lcft(?:\.[A-Za-z_]\w*)+", text)) - {"lcft.json"}:
            if not _resolves(name):
                wrong.append(f"{doc.name}: {name}")
    assert not wrong, f"named in the docs, not in the tree: {wrong}"


def _command_lines(text: str) -> list[str]:
    """The `lcft ...` command lines of a markdown text: fenced lines (continuations joined) and code spans."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            m = re.search(r"(?:^|\$ |exec )(lcft [^#\"|]*)", line.strip())
            lines += [m.group(1)] if m else []
    return lines + re.findall(r"`(lcft [^`|]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def test_every_command_line_the_docs_show_uses_options_of_its_command():
    root, wrong, seen = typer.main.get_command(app), [], 0
    for doc in DOCS:
        for line in _command_lines(doc.read_text()):
            words = [w for w in shlex.split(line.replace("$", ""))[1:] if w != "..."]
            cmd = root
            while words and words[0] in getattr(cmd, "commands", {}):
                cmd = cmd.commands[words.pop(0)]
            options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
            bad = [w for w in words if w.startswith("-") and w.split("=")[0] not in options]
            seen += 1
            if (cmd is root and not set(words) & {"--help", "--version"}) or bad:
                wrong.append(f"{doc.name}: {line.strip()} ({' '.join(bad) or 'no command'})")
    assert seen > 100 and not wrong, wrong
