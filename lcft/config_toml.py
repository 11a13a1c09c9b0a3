"""TOML in and out for configs: a `--config` file or a run's config.toml read with one-line errors, a config
written back (loadable again with `--config`) atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from lcft.config import ConfigError
from lcft.errors import LcftError, printable
from lcft.files import atomic_write, expect_folder, parse_text, read_text, resolved
from lcft.hub import hub_id, read_as_path
from lcft.vocab import kmer_spec

# A config lcft writes is a few KB (an eval's lists every checkpoint by path: thousands of them fit in 1 MiB). A
# checkpoint's config.toml is read from folders others hand over: one of gigabytes is refused, not read whole.
MAX_TOML_BYTES = 16 << 20


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file (`--config`, a run's config.toml); a one-line ConfigError naming it when it is missing,
    unreadable, over MAX_TOML_BYTES, not UTF-8, not TOML or nested too deep (lcft.files.parse_text)."""
    p = Path(path)
    if not p.is_file():  # a folder or a FIFO (which would block the read) is not taken for a config either
        raise ConfigError(f"config file {'is not a regular file' if p.exists() else 'not found'}: {p}")
    try:
        text = read_text(p, MAX_TOML_BYTES, "config file")  # (a FIFO put there since is refused, not waited on)
    except LcftError as e:
        raise ConfigError(str(e)) from None
    return parse_text(tomllib.loads, "TOML", text, str(p), ConfigError)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass (possibly nested) as plain JSON/TOML-able data."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, tuple | list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, Path):
            return str(v)
        return v
    return conv(cfg)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return json.dumps(str(v))
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {type(v).__name__} to TOML")


def dumps_toml(data: Mapping[str, Any]) -> str:
    """A small TOML writer for config data: scalars, lists, and one level of tables. None values are
    omitted (TOML has no null); nested dicts become [tables]."""
    lines, tables = [], []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for name, tbl in tables:
        lines.append(f"\n[{name}]")
        for k, v in tbl.items():
            if v is None:
                continue
            if isinstance(v, Mapping):
                lines.append(f"{k} = {{ " + ", ".join(
                    f"{kk} = {_toml_value(vv)}" for kk, vv in v.items() if vv is not None) + " }")
            else:
                lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


# The config fields, of train, prepare and eval alike, that name files or folders: absolute_paths makes them
# absolute whether or not they exist yet (an output folder is made later), except what some of them hold instead
# of a path, kept as written: a model's or tokenizer's Hub id ORG/NAME[@REVISION] (lcft.hub), --resume's `auto`,
# a built-in tokenizer (char, kmer:K); in kmer:K:PATH only the PATH is a path. A model or tokenizer that is not
# there and reads as a Hub id whose ORG is a local folder is one line here, saying so (lcft.hub.read_as_path).
PATH_FIELDS = ("data", "out", "fasta", "resume", "init", "checkpoints", "tokenizer")
_HUB_FIELDS = ("init", "checkpoints", "tokenizer")
C = TypeVar("C")


def _not_a_path(name: str, value: str) -> bool:
    if name == "resume" and value == "auto":
        return True
    if name == "tokenizer" and (value.strip() in ("", "char") or value.strip().startswith("kmer:")):
        return True  # (a file named char in the working folder is not read for char: lcft.genomics.model_tokenizer)
    return name in _HUB_FIELDS and hub_id(value) is not None


def _unicode(name: str, path: str) -> str:
    """`path` when its name is text: a name whose bytes the file system encoding could not decode (Python holds
    them as surrogates) works for the run, but the config.toml it saves cannot hold it (TOML is Unicode text) and
    no later command could read that back: a resume, a --config rerun."""
    try:
        path.encode()
    except UnicodeEncodeError:
        shown_path = printable(path)
        try:
            os.fsencode(path).decode()
        except UnicodeDecodeError:
            raise ConfigError(f"{name}: {shown_path}: the name is not valid UTF-8 (a saved config cannot hold it): "
                              "rename the file or folder") from None
        raise ConfigError(f"{name}: {shown_path}: the locale's encoding ({sys.getfilesystemencoding()}) cannot hold "
                          "the name (a saved config could not either): run in a UTF-8 locale (LC_ALL=C.UTF-8) or "
                          "with PYTHONUTF8=1") from None
    return path


def absolute_paths(cfg: C) -> C:
    """A config dataclass with its PATH_FIELDS absolute, so a launch's processes, and its saved config rerun with
    --config, name the same files from any working folder."""
    def one(name: str, v: Any) -> Any:
        if isinstance(v, list | tuple):
            return type(v)(one(name, x) for x in v)
        if not isinstance(v, str) or not v:
            return v
        if name == "tokenizer" and (kmer := kmer_spec(v.strip())) and kmer[1]:
            return f"kmer:{kmer[0]}:{one(name, kmer[1])}"
        if _not_a_path(name, v):
            return v
        if name in _HUB_FIELDS and (note := read_as_path(v)):  # made absolute, it no longer shows why it is a path
            raise ConfigError(f"{name}: {v} not found{note}")
        if name == "out":  # resolved, a link to nothing would be followed and its target made: refused as given
            expect_folder(Path(v).expanduser(), "--out")
        return _unicode(name, str(resolved(Path(v).expanduser())))
    fields = {f.name for f in dataclasses.fields(cfg)}  # type: ignore[arg-type]
    return dataclasses.replace(cfg, **{n: one(n, getattr(cfg, n)) for n in PATH_FIELDS if n in fields})  # type: ignore[type-var]


def save_resolved(path: str | os.PathLike, data: Mapping[str, Any]) -> Path:
    """Write the resolved config (TOML, loadable again with --config) atomically."""
    return atomic_write(path, dumps_toml(data))
