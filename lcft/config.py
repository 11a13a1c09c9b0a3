"""Config pieces shared by every component: `ConfigError`, field docstrings as help, sizes, and the value checks
a config runs in its `__post_init__`.

Each component owns a small dataclass whose fields carry a docstring (a string literal right after the
field). Only `lcft.cli` combines them. Building one from flags and TOML is lcft.config_build; TOML files in and
out lcft.config_toml.
"""

from __future__ import annotations

import ast
import dataclasses
import fractions
import functools
import inspect
import math
import re
import textwrap
import typing
from typing import Annotated, Any

from lcft.errors import LcftError, closest, did_you_mean

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


def check_choice(value: Any, tp: Any, name: str) -> Any:
    """The one check of a Literal field's value, for flags, TOML and configs built in Python alike."""
    choices = typing.get_args(tp)
    if isinstance(value, list | dict) or value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, choices))}"
                          f"{did_you_mean(closest(value, map(str, choices)) if isinstance(value, str) else None)}")
    return value


@functools.cache
def _literal_fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(field, its Literal, whether None is allowed) of every dataclass field typed as a Literal alias or an
    optional one."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        for tp in (hints[f.name], *typing.get_args(hints[f.name])):
            if typing.get_origin(tp) is typing.Literal:
                out.append((f.name, tp, type(None) in typing.get_args(hints[f.name])))
                break
    return tuple(out)


def check_choices(cfg: Any) -> None:
    """check_choice on every Literal field of a config dataclass (None is 'not given' for optional ones)."""
    for name, tp, optional in _literal_fields(type(cfg)):
        if getattr(cfg, name) is not None or not optional:
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
