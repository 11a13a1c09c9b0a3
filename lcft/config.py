"""Config plumbing shared by every component: field docstrings as help, sizes, TOML in and out, precedence.

Each component owns a small dataclass whose fields carry a docstring (a string literal right after the
field). Only `lcft.cli` combines them. Precedence: dataclass defaults < `--config` TOML < command-line flags.
"""

from __future__ import annotations

import ast
import dataclasses
import fractions
import functools
import inspect
import json
import math
import os
import re
import textwrap
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

from lcft.errors import LcftError, closest, did_you_mean, shown
from lcft.files import atomic_write, parse_text

T = TypeVar("T")


INT_LIMIT = 1 << 63  # every integer option: what a 64-bit signed integer holds
SEED_LIMIT = 1 << 63  # numpy's generators take no negative seed; torch.manual_seed none at or above 2**64


class ConfigError(LcftError, ValueError):
    """A config value or key is wrong; the message names it."""


SIZE = "size"
Size = Annotated[int, SIZE]
"""An int field holding a token count: TOML and flags accept 512K / 1M, help shows the default as 512K."""


def is_size(tp: Any) -> bool:
    """Whether a (possibly Optional / tuple) annotation resolved with extras is, or holds, a `Size`."""
    if typing.get_origin(tp) is Annotated:
        return SIZE in tp.__metadata__
    return any(is_size(a) for a in typing.get_args(tp))


@functools.cache
def _source_docs(cls: type) -> tuple[dict[str, str], bool]:
    """Attribute docstrings of a dataclass ({field: the string literal after its declaration}) and whether
    every dataclass in its MRO had readable source. Without source (a .pyc-only install, a frozen app) the
    attribute docstrings are gone: help then shows no text."""
    docs: dict[str, str] = {}
    complete = True
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        except Exception:  # no source, or source that no longer matches the class
            complete = False
            continue
        for prev, node in zip(body, body[1:], strict=False):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                docs[prev.target.id] = " ".join(node.value.value.split())
    return docs, complete


def doc(cls: type, name: str) -> str:
    """Help text of one field: raises if the field has no docstring (every field must have one), or ''
    when the source is not available to read it from."""
    docs, complete = _source_docs(cls)
    if name in docs:
        return docs[name]
    if not complete:
        return ""
    raise KeyError(f"{cls.__name__}.{name} has no docstring")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(?:[bB][pP]?)?\s*$")


def parse_size(value: int | str) -> int:
    """'512K' -> 524288, '1M' -> 1048576, '65536' -> 65536 (binary multiples, as sequence lengths are)."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {value!r}")
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(f"not a size: {value!r} (use e.g. 65536, 512K, 1M)")
    try:  # exact: a float would round a long number, and overflow to infinity
        out = fractions.Fraction(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    except ValueError:  # more digits than Python converts
        raise ConfigError(f"not a size: {value!r} (too many digits)") from None
    if out.denominator != 1 or out <= 0:
        raise ConfigError(f"not a whole positive size: {value!r}")
    return int(out)


def format_size(n: int) -> str:
    """524288 -> '512K' (inverse of parse_size where exact)."""
    for unit, mult in (("M", 1 << 20), ("K", 1 << 10)):
        if n % mult == 0 and n >= mult:
            return f"{n // mult}{unit}"
    return str(n)


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file (`--config`, a run's config.toml); a one-line ConfigError naming it when it is missing,
    unreadable, not UTF-8, not TOML or nested too deep (lcft.files.parse_text)."""
    p = Path(path)
    if not p.is_file():  # a folder or a FIFO (which would block the read) is not taken for a config either
        raise ConfigError(f"config file {'is not a regular file' if p.exists() else 'not found'}: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read ({e})") from None
    return parse_text(tomllib.loads, "TOML", text, str(p), ConfigError)


def merge(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Later layers win; None values in a layer mean 'not given' (typer's default for unset flags)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in (layer or {}).items():
            if v is not None:
                out[k] = v
    return out


def check_keys(values: Mapping[str, Any], known: Iterable[str], where: str = "config") -> None:
    """Unknown keys are an error naming the key (typos must not be silently ignored) and the closest known one."""
    known = set(known)
    for k in values:
        if k not in known:
            raise ConfigError(f"unknown {where} key {k!r}{did_you_mean(closest(k, known))}")


def check_choice(value: Any, tp: Any, name: str) -> Any:
    """The one check of a Literal field's value, for flags, TOML and configs built in Python alike."""
    choices = typing.get_args(tp)
    if isinstance(value, list | dict) or value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, choices))}"
                          f"{did_you_mean(closest(value, map(str, choices)) if isinstance(value, str) else None)}")
    return value


@functools.cache
def _literal_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(field, its Literal) of every dataclass field typed as a Literal alias or an optional one."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        for tp in (hints[f.name], *typing.get_args(hints[f.name])):
            if typing.get_origin(tp) is typing.Literal:
                out.append((f.name, tp))
                break
    return tuple(out)


def check_choices(cfg: Any) -> None:
    """check_choice on every Literal field of a config dataclass (None is 'not given' for optional ones)."""
    for name, tp in _literal_fields(type(cfg)):
        if getattr(cfg, name) is not None:
            check_choice(getattr(cfg, name), tp, name)


def at_least_one(cfg: Any, *names: str) -> None:
    """Optional counts given must be at least 1."""
    for name in names:
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be at least 1 (got {v})")


def at_most(cfg: Any, limit: int, why: str, *names: str) -> None:
    """Counts given must not exceed `limit` (`why`: what the limit is, for the message)."""
    for name in names:
        v = getattr(cfg, name)
        if v is not None and v > limit:
            raise ConfigError(f"{name} must be at most {limit:,} ({why}), got {v}")


def not_negative(cfg: Any, *names: str) -> None:
    """Options given must not be negative."""
    for name in names:
        v = getattr(cfg, name)
        if v is not None and v < 0:
            raise ConfigError(f"{name} must not be negative (got {v})")


def check_seed(cfg: Any) -> None:
    """`cfg.seed` a whole number in [0, 2**63): what numpy's generators and torch.manual_seed both take."""
    if isinstance(cfg.seed, bool) or not 0 <= cfg.seed < SEED_LIMIT:
        raise ConfigError(f"seed must be a whole number in [0, 2**63) (got {cfg.seed!r})")


def finite(cfg: Any, *names: str) -> None:
    """Every float option finite (inf/nan would train to NaN weights or skip every step)."""
    for name in names:
        v = getattr(cfg, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
            raise ConfigError(f"{name} must be a finite number (got {v!r})")


def _kind(value: Any) -> str:
    """How a value read from TOML is described in an error ('a list', 'a float 1.7')."""
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"{type(value).__name__} {value!r}"


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """A flag's text or a TOML value as the field's type, checked as strictly for TOML as for flags: a float
    where an int belongs, a list where a string belongs, a non-finite number are each a one-line error."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], name) if len(args) == 1 else value
    if origin is typing.Literal:
        return check_choice(value, tp, name)
    if origin is Annotated:
        if SIZE in tp.__metadata__:
            return _coerce_int(value, name, size=True)
        return _coerce(value, typing.get_args(tp)[0], name)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name}: expected a list, got {_kind(value)}")
        inner = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        return origin(_coerce(v, inner, name) for v in value)
    if tp is bool:
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{name}: not a boolean: {value!r}")
        if not isinstance(value, bool | int) or isinstance(value, int) and value not in (0, 1):
            raise ConfigError(f"{name}: not a boolean: {_kind(value)}")
        return bool(value)
    if tp is int:
        return _coerce_int(value, name)
    if tp is float:
        return _coerce_float(value, name)
    if tp is str and not isinstance(value, str | Path):
        raise ConfigError(f"{name}: expected a string, got {_kind(value)}")
    return value


def _coerce_int(value: Any, name: str, size: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):  # 1.7 is not silently truncated to 1
        raise ConfigError(f"{name}: not an integer: {_kind(value)}")
    try:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            out = int(value)  # plain integers, including 0 and negatives (--save-every 0)
        else:
            out = parse_size(value) if isinstance(value, str) else value
    except (ConfigError, ValueError):
        hint = " (a size: e.g. 65536, 512K, 1M)" if size else ""
        raise ConfigError(f"{name}: not an integer: {value!r}{hint}") from None
    # every count and step lcft keeps fits a 64-bit integer (torch's and numpy's, a trainer state's); fields
    # bound themselves more tightly where a figure is computed from them
    if not -INT_LIMIT <= out < INT_LIMIT:
        raise ConfigError(f"{name}: {shown(out)} is past the 64-bit range lcft takes (|n| < 2**63)")
    return out


def _coerce_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{name}: not a number: {_kind(value)}")
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{name}: not a number: {value!r}") from None
    if not math.isfinite(out):  # inf/nan would train to NaN weights or skip every step
        raise ConfigError(f"{name}: must be a finite number (got {value!r})")
    return out


def build(cls: type[T], values: Mapping[str, Any], where: str | None = None) -> T:
    """Instantiate a config dataclass from a flat mapping: unknown keys are errors, values are coerced
    to the field types (sizes like '512K' for int fields, 'a,b' for tuple fields)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    check_keys(values, fields, where or cls.__name__)
    hints = typing.get_type_hints(cls, include_extras=True)  # Size fields' text says how sizes are written
    kwargs = {k: _coerce(v, hints[k], k) for k, v in values.items()}
    return cls(**kwargs)


def load_layer(path: str | os.PathLike, table: str | None = None) -> dict[str, Any]:
    """A `--config` TOML as one flat layer: its top-level keys, plus those under a [table] named after the
    command (e.g. [prepare]), which win."""
    data = load_toml(path)
    if table and isinstance(data.get(table), dict):
        inner = data.pop(table)
        data.update(inner)
    return data


def resolve(cls: type[T], config_file: str | os.PathLike | None, flags: Mapping[str, Any] | None,
            where: str | None = None, table: str | None = None) -> T:
    """defaults < `--config` TOML < flags (None in flags = not given); unknown keys are an error naming them; a
    leading '~' of a value is the home folder (`home`)."""
    layers = [load_layer(config_file, table) if config_file else {}, flags or {}]
    return build(cls, {k: home(v) for k, v in merge(*layers).items()}, where=where)


def home(value: Any) -> Any:
    """A path value's leading '~' ('~' or '~/...') as the home folder, as a shell expands it: in a TOML, or in a
    flag written `--out=~/x` (which the shell passes as it is), it would otherwise name a folder '~' in the working
    folder. Relative paths stay relative to the working folder, in a TOML too."""
    if isinstance(value, str) and (value == "~" or value.startswith("~/")):
        return os.path.expanduser(value)
    if isinstance(value, list | tuple):
        return type(value)(home(v) for v in value)
    return value


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


def paths_absolute(data: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """`data` with the values under `keys` that name existing paths made absolute, so a saved config reruns
    from any working folder; what names no path (a Hub id, a tokenizer spec such as kmer:6) stays as written."""
    def one(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return type(v)(one(x) for x in v)
        return str(Path(v).expanduser().resolve()) if isinstance(v, str) and v and Path(v).expanduser().exists() else v
    return {k: one(v) if k in keys else v for k, v in data.items()}


def save_resolved(path: str | os.PathLike, data: Mapping[str, Any]) -> Path:
    """Write the resolved config (TOML, loadable again with --config) atomically."""
    return atomic_write(path, dumps_toml(data))
