"""Per-window losses of a running `lcft eval`, kept in its output folder's `.partial/` so that a killed
evaluation resumes where it stopped: one append-only file per pass (a checkpoint's windows, or its copy probe,
under the options that change a loss), each record checked by its own digest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lcft.disk import removed_or_said, write_failure
from lcft.errors import RESUME, LcftError
from lcft.files import atomic_write, no_follow, read_json
from lcft.foreign_entries import refuse_foreign, resume_own

PARTIAL = ".partial"
FORMAT = 1
INDEX_BYTES, DIGEST_BYTES = 8, 16


def pass_key(identity: dict[str, Any]) -> str:
    """The file name stem of a pass: 128 bits of the sha256 of everything its losses depend on."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def clear(out: str | os.PathLike, warn: Callable[[str], None]) -> None:
    """Drop every kept pass of the output folder `out` (its report is written: nothing is left to resume); what
    cannot be removed, losses of every window evaluated, is a warning to `warn`."""
    partial = Path(out) / PARTIAL
    removed_or_said(partial, warn, f"the finished evaluation's {partial}",
                    " (the next evaluation into this folder tries again)")


def discarded(out: str | os.PathLike, passes: list[LossStore]) -> str | None:
    """One line for a run whose passes are `passes`: the kept passes of `out`/.partial that none of them reads back
    (the report's writing removes them), and why, from what differs between each one's note and the nearest of
    `passes` (a layout, a checkpoint, an option changed); None when there are none."""
    partial = Path(out) / PARTIAL
    if not partial.is_dir():
        return None
    refuse_foreign(partial, "eval")  # before a note is read
    ours = {p.path for p in passes}
    stale = [f for f in sorted(partial.glob("*.losses")) if f not in ours]
    if not stale:
        return None
    identities = [json.loads(json.dumps(p.identity)) for p in passes]  # as a note reads back (tuples as lists)
    why = dict.fromkeys(_why(_note(f), identities) for f in stale)  # in order, each once
    n = len(stale)
    return (f"{partial}: {n} kept pass{'es' * (n > 1)} of losses not read back ({'; '.join(why)}): "
            f"discarded, {'their' if n > 1 else 'its'} losses are computed again")


def _note(losses: Path) -> dict[str, Any] | None:
    """The identity a kept pass's note says it stands for; None when it is missing or unreadable."""
    try:
        return read_json(losses.with_suffix(".json"))
    except LcftError:
        return None


def _why(note: dict[str, Any] | None, ours: list[dict[str, Any]]) -> str:
    """Why the pass of `note` is none of `ours`: what differs from the nearest of them (fewest keys apart, a copy
    probe's options counted one by one)."""
    if note is None or not ours:
        return "of unknown inputs: its note is missing or unreadable"
    old = _flat(note)
    new = min((_flat(o) for o in ours), key=lambda o: sum(old.get(k) != o.get(k) for k in {*old, *o}))
    if old.get("pass") != new.get("pass"):  # a copy probe's pass against windows: their options say nothing
        return "no copy probe asked for" if old.get("pass") == "probe" else "another pass"
    keys = [k for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    if not keys:
        return "of another store format"
    return ", ".join(dict.fromkeys(_change(k, old.get(k), new.get(k)) for k in keys))


def _flat(identity: dict[str, Any]) -> dict[str, Any]:
    """A pass's identity with a copy probe's options (its "pass") as keys of their own, its "pass" "probe"."""
    kind = identity.get("pass")
    options = kind.get("probe") if isinstance(kind, dict) else None
    return {**identity, "pass": "probe", **options} if isinstance(options, dict) else identity


CHANGED = {"weights": "the checkpoint changed: other weights", "config": "the checkpoint changed: its config.json",
           "meta": "the checkpoint changed: its lcft.json", "data": "the data changed: other token files",
           "planting": "the copy probe plants other windows"}
"""What a changed key of a pass's identity means, where its values say nothing to a reader (digests, files)."""


def _change(key: str, old: Any, new: Any) -> str:
    """One key of a kept pass's identity `old` that this run's `new` differs in, in words."""
    if key in CHANGED:
        return CHANGED[key]
    if key == "cp" and isinstance(old, list) and isinstance(new, list) and len(old) == len(new) == 3:
        return "the layout changed: " + ", ".join(f"{name}={a} -> {name}={b}" for name, a, b in
                                                  zip(("cp", "cp_layout", "cp_kv"), old, new, strict=True) if a != b)
    if key == "whole_windows":
        return "the copy probe ran " + ("whole windows on several ranks, pieces in one process now" if old else
                                        "pieces in one process, whole windows on several ranks now")
    probe = "probe " if key in ("segment", "distances", "mutation", "seed") else ""  # a copy probe's option
    return f"{probe}{key} {_short(old)} -> {_short(new)}"


def _short(value: Any) -> str:
    """A value of a note as a few characters (a note is the folder's, which a person may have edited)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


class LossStore:
    """The losses of one pass, item by item in order: item i is the last `keep` tokens' loss (float32) and
    counted flags of window (or planted window) i. A record is those bytes, the counted flags packed, the item's
    index and a blake2b digest of the rest, so a torn or stale tail reads as absent and is computed again."""

    def __init__(self, out: str | os.PathLike, identity: dict[str, Any], keep: int) -> None:
        key = pass_key({**identity, "format": FORMAT, "keep": keep})
        self.path = Path(out) / PARTIAL / f"{key}.losses"  # made with the first item: a failed start leaves nothing
        self.identity, self.keep = identity, keep
        self.record = keep * 4 + (keep + 7) // 8 + INDEX_BYTES + DIGEST_BYTES
        self._start: int | None = None
        self._next = 0

    def resume_at(self, n: int, batch: int) -> int:
        """Items 0..start-1 are kept and read back from here: the whole records that check, at most `n`, rounded
        down to a multiple of `batch` unless all `n` are kept (the batches after them are then those of an
        uninterrupted run, and give its losses bit for bit). The file is cut to them."""
        if self._start is None:
            refuse_foreign(self.path.parent, "eval")  # before a record is read, cut or appended
            kept = resume_own(self.path, "eval", within=self.path.parent)  # cut in place: never a file's other name
            with kept or contextlib.nullcontext():
                whole = sum(1 for _ in self._records(n))
                self._start = whole if whole >= n else whole // batch * batch
                if kept is not None:
                    kept.truncate(self._start * self.record)
            self._next = self._start
        return self._start

    def _records(self, n: int) -> Iterator[bytes]:
        """Whole records in order up to the first that does not check: its digest, its index out of place, or a
        non-finite loss. A pass that computed one failed on it (a diverged model): a rerun computes it again rather
        than blame the model for what the file holds (the digest is unkeyed: it catches damage, not a forger)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            for i in range(n):
                rec = fh.read(self.record)
                if len(rec) < self.record:
                    return
                body, digest = rec[:-DIGEST_BYTES], rec[-DIGEST_BYTES:]
                if hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest() != digest or \
                        int.from_bytes(body[-INDEX_BYTES:], "little") != i or \
                        not np.isfinite(np.frombuffer(body, np.float32, self.keep)).all():
                    return
                yield body

    def items(self, upto: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(i, loss (keep,) float32, counted (keep,) bool) of the kept items 0..upto-1."""
        k = self.keep
        for i, body in enumerate(self._records(upto)):
            loss = np.frombuffer(body, dtype=np.float32, count=k).copy()  # (keep,)
            counted = np.unpackbits(np.frombuffer(body, np.uint8, (k + 7) // 8, k * 4), count=k).astype(bool)  # (keep,)
            yield i, loss, counted

    def add(self, i: int, loss: np.ndarray, counted: np.ndarray) -> None:
        """Append item i (the next one) from its loss and counted, `(L,)` each, of which the last `keep` are kept;
        one unbuffered write, so a kill loses at most the record being written."""
        if self._start is None or i != self._next or loss.dtype != np.float32:
            raise ValueError(f"item {i} ({loss.dtype}) added where item {self._next} (float32) is next")
        body = (np.ascontiguousarray(loss[-self.keep:]).tobytes()
                + np.packbits(np.asarray(counted[-self.keep:], dtype=bool)).tobytes() + i.to_bytes(INDEX_BYTES, "little"))
        try:
            if not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # what the key stands for, for a person reading the folder (read back only to say why a rerun
                # discards the pass: `discarded`)
                atomic_write(self.path.with_suffix(".json"), json.dumps(self.identity, indent=1, sort_keys=True) + "\n")
            with open(self.path, "ab", buffering=0, opener=no_follow) as fh:
                rest = memoryview(body + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest())
                while rest:  # a write cut short (a disk filling, a file-size limit) is not the record: write on,
                    rest = rest[fh.write(rest):]  # and the next write says why it cannot
        except OSError as e:  # a torn record is not read back: what was kept before it still is
            raise LcftError(f"cannot keep losses in {self.path.parent}: {write_failure(e)}; fix "
                            f"the cause and {RESUME}") from None
        self._next += 1
