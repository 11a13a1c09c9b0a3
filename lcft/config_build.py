"""A config dataclass from flags and TOML: values coerced to the field types as strictly for TOML as for flags,
unknown keys refused, and the precedence dataclass defaults < `--config` TOML < command-line flags."""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

from lcft.config import SIZE, ConfigError, check_choice, parse_size
from lcft.config_toml import load_toml
from lcft.errors import closest, did_you_mean, shown

T = TypeVar("T")


INT_LIMIT = 1 << 63  # every integer option: what a 64-bit signed integer holds


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


def load_layer(path: str | os.PathLike | None, cls: type, table: str | None = None,
               others: Collection[str] | None = None) -> dict[str, Any]:
    """A `--config` TOML as one flat layer: its top-level keys, plus those under the [table] named after the
    command (e.g. [prepare]), which win; the `others` tables (the other commands', which the CLI declares) are
    passed over, and any other table is an error that names the closest table name (None: a caller outside the
    CLI passes over every other table). A field of the config dataclass `cls` is the config's own, whatever its
    value: a field given a table is left to the field's check, which says what it takes. No file: no layer."""
    if not path:
        return {}
    data, fields = load_toml(path), {f.name for f in dataclasses.fields(cls)}
    tables: dict[str, Any] = {}
    for k, v in list(data.items()):
        if not isinstance(v, dict) or k in fields:
            continue
        if k != table and others is not None and k not in others:
            known = {t for t in (table, *others) if t}
            meant, names = closest(k, known), ", ".join(f"[{t}]" for t in sorted(known))
            raise ConfigError(f"unknown config table [{k}]" + (f" (did you mean [{meant}]?)" if meant else
                                                               f": the tables are {names}"))
        tables[k] = data.pop(k)
    data.update(tables.get(table, {}) if table else {})
    return data


def resolve(cls: type[T], config_file: str | os.PathLike | None, flags: Mapping[str, Any] | None,
            where: str | None = None, table: str | None = None, others: Collection[str] | None = None) -> T:
    """defaults < `--config` TOML < flags (None in flags = not given); unknown keys are an error naming them; a
    leading '~' of a value is the home folder (`home`)."""
    return from_layers(cls, load_layer(config_file, cls, table, others), flags, where)


def from_layers(cls: type[T], toml: Mapping[str, Any], flags: Mapping[str, Any] | None, where: str | None = None) -> T:
    """`resolve` from a TOML layer already read (`load_layer`)."""
    return build(cls, {k: home(v) for k, v in merge(toml, flags).items()}, where=where)


def home(value: Any) -> Any:
    """A path value's leading '~' ('~' or '~/...') as the home folder, as a shell expands it: in a TOML, or in a
    flag written `--out=~/x` (which the shell passes as it is), it would otherwise name a folder '~' in the working
    folder. Relative paths stay relative to the working folder, in a TOML too."""
    if isinstance(value, str) and (value == "~" or value.startswith("~/")):
        return os.path.expanduser(value)
    if isinstance(value, list | tuple):
        return type(value)(home(v) for v in value)
    return value
