"""The checkpoint of a `lcft prepare windows` run in its folder's `.partial/state.json`: read back only when it is
of the same options and has the kinds `_run` writes; anything else starts the run over."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lcft.errors import LcftError
from lcft.files import read_json
from lcft.genomics.shards import SPLITS, is_count

STATE = "state.json"


def load_state(partial: Path, options: dict) -> dict | None:
    """The checkpoint of a killed run of these options, or None (start over) when there is none, or it is torn,
    of other options, or not what `_run` writes (its fields are used as they are)."""
    try:
        state = read_json(partial / STATE)  # bounded nesting: a deep file is refused, not a RecursionError
    except LcftError:
        return None
    return state if state.get("options") == options and _state_fits(state, options["length"]) else None


def _state_fits(state: dict, length: int) -> bool:
    """The fields `_run` resumes from have their kinds, and agree: per split a list of whole sizes and one of
    text digests; chromosome and window records as `_cut_one` writes them, as many windows recorded as counted
    and as the soft-mask file's size (the second of a split's files, `length`/8 bytes a window) holds; letter
    counts as whole numbers; finished true or false."""
    sizes, digests, letters = state.get("sizes"), state.get("digests", {}), state.get("oov_letters", {})
    chroms, records = state.get("chroms"), state.get("records")
    if not (isinstance(sizes, dict) and all(_list_of(sizes.get(s), is_count) and len(sizes[s]) >= 2 for s in SPLITS)
            and isinstance(digests, dict) and all(_list_of(d, lambda v: isinstance(v, str)) for d in digests.values())
            and _list_of(chroms, _chrom_fits) and _list_of(records, _record_fits)
            and isinstance(letters, dict)
            and all(isinstance(v, dict) and all(map(is_count, v.values())) for v in letters.values())
            and type(state.get("finished", False)) is bool):
        return False
    for split in SPLITS:
        windows = sum(c["windows"] for c in chroms if c["split"] == split)
        if windows != sum(r["split"] == split for r in records) or sizes[split][1] != windows * (length // 8):
            return False
    return True


def _chrom_fits(c: Any) -> bool:
    return (isinstance(c, dict) and c.get("split") in SPLITS and isinstance(c.get("chrom"), str)
            and all(is_count(c.get(k)) for k in ("length", "windows", "skipped_n")))


def _record_fits(r: Any) -> bool:
    return (isinstance(r, dict) and r.get("split") in SPLITS and isinstance(r.get("chrom"), str)
            and all(is_count(r.get(k)) for k in ("start", "end", "oov")) and r["start"] < r["end"]
            and is_count(r.get("bases", 0)))


def _list_of(value: Any, each: Callable[[Any], bool]) -> bool:
    return isinstance(value, list) and all(map(each, value))
