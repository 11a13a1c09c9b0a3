"""On-disk window shards: {split}.bin (ids, window i at i*L), {split}.softmask.bin (packed bits, window i at
i*L/8), side files of model tokenizers, manifest.json; the writer (resumable, hashed) and the verifier.
The reader is `window_set.WindowSet`."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lcft.errors import LcftError, shown
from lcft.files import atomic_open, expect_folder, fresh_file, is_plain_name, read_json
from lcft.foreign_entries import open_own
from lcft.hashing import file_hash
from lcft.vocab import spec_problem

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "eval")
SPLIT_COUNTS = ("windows", "skipped_n", "tokens")  # whole numbers each split of a manifest records


def bin_name(split: str) -> str:
    return f"{split}.bin"


def softmask_name(split: str) -> str:
    return f"{split}.softmask.bin"


class HashedFile:
    """An append-only output file with a running sha256 (fed by its user, see `append`); reopening at a
    checkpoint (`keep` bytes whose sha256 is `digest`) re-hashes the kept prefix and, when it is still what the
    checkpoint recorded, cuts the file to it, so a resumed run ends with the same bytes and digest. A file that
    cannot resume (missing, shorter, other bytes, or no regular file: a link is never written through) is
    replaced by a new empty one."""

    def __init__(self, path: Path, keep: int = 0, digest: str = "") -> None:
        self.path = path
        fh = open_own(path) if keep else None
        if fh is not None:
            self.hash = file_hash(fh, "sha256", keep)  # reads from the start: checked before anything is cut
            if fh.tell() == keep and self.hash.hexdigest() == digest:
                fh.truncate(keep)
                self.fh = fh
            else:
                fh.close()
                fh = None
        if fh is None:
            self.fh = os.fdopen(fresh_file(path), "wb")
            self.hash = hashlib.sha256()
        self.size = self._synced = self.fh.tell()

    def append(self, data: bytes | memoryview, sync_every: int = 0) -> None:
        """Append bytes whose hash the caller feeds to `self.hash` itself, in the same order (SplitWriter
        hashes on one thread and writes on another).
        With `sync_every`, also push the data to disk each time that many more bytes are written."""
        self.fh.write(data)
        self.size += len(data)
        if sync_every and self.size - self._synced >= sync_every:
            self.sync()

    def sync(self) -> None:
        self.fh.flush()
        os.fdatasync(self.fh.fileno())
        self._synced = self.size

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


class SplitWriter:
    """Appends windows of one split: ids to {split}.bin, bit-packed soft mask to {split}.softmask.bin.

    Two background threads form a pipeline behind the tokenizer on the main thread: the first hashes each
    window, the second writes it. sha256 and file writes both release the GIL, so the three threads keep
    both cores busy (hashing costs about half as much as reading and tokenizing). Bounded queues keep
    memory at a few windows. `buffers()` hands out id/mask buffers from a pool the write thread refills: a
    fresh 512 KiB buffer per window would cost its page faults every time. Errors (e.g. disk full)
    surface on the next add() or at flush()."""

    QUEUE_WINDOWS = 4
    POOL_MIB = 16  # at most this much pooled window buffers: enough to ride out a write thread waiting on the disk
    # Push written data to disk every 8 MiB on the write thread, overlapping the disk with the tokenizer;
    # otherwise the one fsync before the manifest waits for the whole split (0.46 ns/base, a quarter of
    # the run, measured on a 60 Mbp genome).
    SYNC_BYTES = 1 << 23

    def __init__(self, folder: Path, split: str, keep: tuple[int, ...] = (0, 0), names: tuple[str, ...] = (),
                 digests: tuple[str, ...] = ()) -> None:
        self.split = split
        names = names or (bin_name(split), softmask_name(split))
        keep = tuple(keep) + (0,) * (len(names) - len(keep))
        digests = tuple(digests) + ("",) * (len(names) - len(digests))  # none recorded: no file resumes
        # one file per array passed to add(): ids and soft mask, then any side files (model tokenizers)
        self.outputs = [HashedFile(folder / n, k, d) for n, k, d in zip(names, keep, digests, strict=False)]
        self.ids, self.soft = self.outputs[0], self.outputs[1]
        self._hash_q: queue.Queue = queue.Queue(self.QUEUE_WINDOWS)
        self._write_q: queue.Queue = queue.Queue()  # bounded by the pool (or by _hash_q for other arrays)
        self._free: queue.Queue = queue.Queue()  # pooled (ids, soft) buffer pairs ready for reuse
        self._pooled: set[int] = set()
        self._pool_length = 0
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._work, args=(self._hash_q, self._hash), name=f"lcft-hash-{split}", daemon=True),
            threading.Thread(target=self._work, args=(self._write_q, self._write), name=f"lcft-write-{split}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _hash(self, item: tuple[np.ndarray, ...]) -> None:
        for f, a in zip(self.outputs, item, strict=True):
            f.hash.update(memoryview(a))
        self._write_q.put(item)

    def _write(self, item: tuple[np.ndarray, ...]) -> None:
        for f, a in zip(self.outputs, item, strict=True):
            f.append(memoryview(a), self.SYNC_BYTES)
        if id(item[0]) in self._pooled:
            self._free.put(item)

    def _work(self, q: queue.Queue, step: Callable[[Any], None]) -> None:
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    step(item)
            except BaseException as e:  # handed to the main thread by _raise()
                self._error = e
            finally:
                q.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def buffers(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """A free pair of (length,) ids and (length/8,) soft-mask uint8 buffers to fill and pass to add().
        The pool grows only while every pair is still queued (fresh pages cost page faults), up to
        POOL_MIB; past that this waits for the write thread to hand one back."""
        self._raise()
        if length != self._pool_length:
            self._free, self._pooled, self._pool_length = queue.Queue(), set(), length
        if self._free.empty() and len(self._pooled) < max(self.QUEUE_WINDOWS + 2, (self.POOL_MIB << 20) // length):
            pair = (np.empty(length, np.uint8), np.empty(length // 8, np.uint8))
            self._pooled.add(id(pair[0]))
            return pair
        return self._free.get()

    def add(self, ids: np.ndarray, softmask_packed: np.ndarray, *side: np.ndarray) -> None:
        """Append one window: (L,) uint8 ids and its (L/8,) soft mask from np.packbits (big bit order:
        bit 7 of byte j is token 8j; np.unpackbits inverts it). The arrays must not be modified after
        (buffers from `buffers()` go back to the pool once written). `side`: one array per side file."""
        self._raise()
        arrays = (np.ascontiguousarray(a) for a in (ids, softmask_packed, *side))
        # as bytes (files count bytes); uint8 arrays stay the same object, so pooled buffers are recognised
        self._hash_q.put(tuple(a if a.dtype == np.uint8 else a.view(np.uint8) for a in arrays))

    def drain(self) -> None:
        """Wait until every added window is hashed and written; re-raise an error of either."""
        self._hash_q.join()
        self._write_q.join()
        self._raise()

    def sizes(self) -> tuple[int, ...]:
        self.drain()
        return tuple(f.size for f in self.outputs)

    def digests(self) -> tuple[str, ...]:
        self.drain()
        return tuple(f.hash.hexdigest() for f in self.outputs)

    def flush(self) -> None:
        self.drain()
        for f in self.outputs:
            f.flush()

    def sync(self) -> None:
        self.drain()
        for f in self.outputs:
            f.sync()

    def files(self) -> dict[str, dict[str, Any]]:
        self.drain()
        return {f.path.name: {"bytes": f.size, "sha256": f.hash.hexdigest()} for f in self.outputs}

    def close(self) -> None:
        for q, t in zip((self._hash_q, self._write_q), self._threads, strict=True):
            if t.is_alive():
                q.put(None)
                t.join()
        for f in self.outputs:
            f.close()


def dumps_json(data: Any) -> str:
    """JSON with one line per list item of `records` (readable and diff-able) while every value goes through
    the C encoder (json's indent= path is pure Python and slow for 10^5 records)."""
    if not isinstance(data, dict) or "records" not in data or len(data) == 1:
        return json.dumps(data)
    head = json.dumps({k: v for k, v in data.items() if k != "records"}, indent=1)
    rows = ",\n  ".join(json.dumps(r) for r in data["records"])
    return head[:-2] + ',\n "records": [\n  ' + rows + "\n ]\n}"


def write_json_atomic(path: Path, data: Any, sync: bool = True) -> None:
    """Write JSON via a temp file and rename (readers see the old or the new file, never a torn one)."""
    with atomic_open(path, "w", fsync=sync) as fh:
        fh.write(dumps_json(data))
        fh.write("\n")


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of a prepared folder; a one-line error when the folder or its manifest is missing or unreadable."""
    if Path(out_dir).name == MANIFEST and Path(out_dir).is_file():  # the manifest named, not its folder
        raise LcftError(f"{out_dir} is a windows folder's manifest: give the folder {Path(out_dir).parent}")
    expect_folder(out_dir, hint="expected a folder of windows that `lcft prepare windows --fasta FILE --out DIR` "
                                "writes")  # (a FASTA given as --data)
    if not os.path.lexists(out_dir):  # a mistyped --data: not a folder lacking its manifest
        raise LcftError(f"windows folder not found: {out_dir}")
    p = Path(out_dir) / MANIFEST
    if not p.is_file():
        raise LcftError(f"{p.parent} is not a prepared windows folder (no {MANIFEST}; run `lcft prepare windows`)")
    m = read_json(p)  # unreadable, not JSON, nested too deep, not an object: one line naming it
    if m.get("format_version") != FORMAT_VERSION:
        raise LcftError(f"{p}: format_version {shown(m.get('format_version'))}, this lcft reads {FORMAT_VERSION}")
    _check_names(p, m)
    _check_fields(p, m)
    return m


def is_count(v: Any, low: int = 0) -> bool:
    """A whole number a JSON file of ours records (not a bool), in [low, 2^62)."""
    return isinstance(v, int) and not isinstance(v, bool) and low <= v < 1 << 62


def is_window_length(v: Any) -> bool:
    """A window length prepare takes: a whole number of tokens, positive and a multiple of 8 (soft-mask bits are
    packed by byte, L/8 bytes a window)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v % 8 == 0


def _check_fields(p: Path, m: dict) -> None:
    """The fields readers compute with have their types and ranges (one line naming the first that does not)."""
    def bad(what: str) -> LcftError:
        return LcftError(f"{p}: corrupt manifest ({what})")

    length = m.get("length")
    if not (is_count(length, 1) and is_window_length(length)) or m.get("ids_dtype", "uint8") not in (
            "uint8", "uint16", "uint32"):
        raise bad("'length' or 'ids_dtype' is not what prepare writes")
    if why := spec_problem(m.get("tokenizer")):
        raise bad(f"its tokenizer: {why}")
    source, chroms = m.get("source"), m.get("chroms")
    if not (isinstance(source, dict) and isinstance(source.get("path"), str) and is_count(m.get("stride"), 1)
            and type(m.get("max_n_frac")) in (int, float)):
        raise bad("'source', 'stride' or 'max_n_frac' is not what prepare writes")
    if not (isinstance(chroms, list) and all(
            isinstance(c, dict) and isinstance(c.get("split"), str) and isinstance(c.get("chrom"), str)
            and all(is_count(c.get(k)) for k in ("length", "windows", "skipped_n")) for c in chroms)):
        raise bad("'chroms' is not a list of chromosomes with split, chrom, length, windows, skipped_n")
    if not all(isinstance(info.get("chroms"), list) and all(isinstance(c, str) for c in info["chroms"])
               and all(is_count(info.get(k)) for k in SPLIT_COUNTS) and "files" in info for info in m["splits"].values()):
        raise bad(f"a split's chroms, counts ({', '.join(SPLIT_COUNTS)}) or files are not what prepare writes")
    records = m.get("records")
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and isinstance(r.get("split"), str) and isinstance(r.get("chrom"), str)
            and is_count(r.get("start")) and is_count(r.get("end")) and r["start"] <= r["end"] for r in records):
        raise bad("'records' is not a list of windows with split, chrom, start <= end")
    for files in [m.get("files", {}), *(info.get("files", {}) for info in m["splits"].values())]:
        if not all(isinstance(f, dict) and is_count(f.get("bytes")) and isinstance(f.get("sha256"), str)
                   for f in files.values()):
            raise bad("a listed file has no whole 'bytes' or no 'sha256'")


def _check_names(p: Path, m: dict) -> None:
    """Every file the manifest names is a plain file name of its folder (never `../x` or `/etc/x`): readers
    open them under the folder, and verify hashes them."""
    tok = m.get("tokenizer")
    names = [tok["file"]] if isinstance(tok, dict) and "file" in tok else []
    splits = m.get("splits")
    if not isinstance(splits, dict) or not all(isinstance(v, dict) for v in splits.values()):
        raise LcftError(f"{p}: corrupt manifest ('splits' is not an object of objects)")
    files = [m.get("files", {}), *(info.get("files", {}) for info in splits.values())]
    if not all(isinstance(f, dict) for f in files):
        raise LcftError(f"{p}: corrupt manifest (a 'files' entry is not an object)")
    for name in [*names, *(n for f in files for n in f)]:
        if not is_plain_name(name):
            raise LcftError(f"{p}: names file {shown(name, quoted=True)}, which is not a file of the windows folder (refused)")


def expected_sizes(m: dict, split: str) -> dict[str, int]:
    """Bytes each file of a split must hold for the manifest's windows: n windows of L tokens (ids at the
    manifest's dtype, soft mask L/8 bytes; model tokenizers also uint16 bases per token and a bit per base)."""
    records = [r for r in m.get("records", []) if r.get("split") == split]
    n, length = len(records), int(m.get("length", 0))
    sizes = {bin_name(split): n * length * np.dtype(m.get("ids_dtype", "uint8")).itemsize,
             softmask_name(split): n * length // 8}
    if "bases_file" in m:  # names as window_set.bases_name / basemask_name
        sizes[f"{split}.bases.bin"] = n * length * 2
        sizes[f"{split}.basemask.bin"] = sum((r["end"] - r["start"] + 7) // 8 for r in records)
    return sizes


def _check_layout(d: Path, m: dict, split: str, files: dict) -> None:
    """The manifest agrees with itself: each listed size is what its windows need (the reader maps by it)."""
    for name, want in expected_sizes(m, split).items():
        if name in files and files[name].get("bytes") != want:
            n = sum(r.get("split") == split for r in m.get("records", []))
            raise LcftError(f"{d / MANIFEST} is inconsistent: {name} should hold {want} bytes for {n} windows "
                            f"of {m.get('length')} tokens, the manifest lists {files[name].get('bytes')}")


def windows_identity(manifest: dict[str, Any], split: str) -> dict[str, Any]:
    """What identifies the windows of one split of a prepared data folder, wherever it lies and however its source
    was named: their length and stride and the sha256 of each file of the split, as its manifest records them
    (verify_windows checks them against the files)."""
    files = manifest["splits"][split].get("files", {})
    return {"length": manifest.get("length"), "stride": manifest.get("stride"),
            "sha256": {name: meta["sha256"] for name, meta in sorted(files.items())}}


def verify_windows(out_dir: str | os.PathLike, splits: tuple[str, ...] | None = None) -> dict:
    """Check the manifest against itself (file sizes for its windows), then recompute sizes and sha256 of every
    file it lists (of `splits` only, when given, plus the tokenizer's); raise LcftError naming the first
    inconsistent or corrupt file. Returns the manifest."""
    d = Path(out_dir)
    m = read_manifest(d)
    chosen = {k: v for k, v in m["splits"].items() if splits is None or k in splits}
    for split, info in chosen.items():
        _check_layout(d, m, split, info["files"])
    groups = [(f"{split} split", info["files"]) for split, info in chosen.items()]
    for what, files in [*groups, ("tokenizer", m.get("files", {}))]:
        for name, meta in files.items():
            p = d / name
            if not p.is_file():
                raise LcftError(f"{p} is missing ({what})")
            if p.stat().st_size != meta["bytes"]:
                raise LcftError(f"{p} is corrupt: {p.stat().st_size} bytes, manifest says {meta['bytes']}")
            if file_hash(p).hexdigest() != meta["sha256"]:
                raise LcftError(f"{p} is corrupt: sha256 differs from the manifest")
    return m
