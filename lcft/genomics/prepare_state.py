"""The checkpoint of a `lcft prepare windows` run in its folder's `.partial/state.json`: read back only when it is
of the same options and has the kinds `_run` writes; anything else starts the run over."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcft.errors import LcftError
from lcft.files import read_json
from lcft.genomics.shards import SPLITS

STATE = "state.json"


def load_state(partial: Path, options: dict) -> dict | None:
    """The checkpoint of a killed run of these options, or None (start over) when there is none, or it is torn,
    of other options, or not what `_run` writes (its fields are used as they are)."""
    try:
        state = read_json(partial / STATE)  # bounded nesting: a deep file is refused, not a RecursionError
    except LcftError:
        return None
    return state if state.get("options") == options and _state_fits(state) else None


def _state_fits(state: dict) -> bool:
    """The fields `_run` resumes from have their kinds: per split a list of whole sizes and one of text digests;
    chromosome and window records as objects; oov letter counts as objects; finished true or false."""
    sizes, digests, letters = state.get("sizes"), state.get("digests", {}), state.get("oov_letters", {})
    return (isinstance(sizes, dict) and all(_list_of(sizes.get(s), lambda v: type(v) is int and v >= 0)
                                            for s in SPLITS)
            and isinstance(digests, dict) and all(_list_of(d, lambda v: isinstance(v, str)) for d in digests.values())
            and _list_of(state.get("chroms"), lambda c: isinstance(c, dict) and isinstance(c.get("chrom"), str))
            and _list_of(state.get("records"), lambda r: isinstance(r, dict))
            and isinstance(letters, dict) and all(isinstance(v, dict) for v in letters.values())
            and type(state.get("finished", False)) is bool)


def _list_of(value: Any, each: Callable[[Any], bool]) -> bool:
    return isinstance(value, list) and all(map(each, value))
