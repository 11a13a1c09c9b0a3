"""On-disk window shards: {split}.bin (uint8 ids, window i at i*L), {split}.softmask.bin (packed bits,
window i at i*L/8), manifest.json; the writer (resumable, hashed), the reader (memmap) and the verifier."""

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

from lcft.errors import LcftError
from lcft.files import atomic_open, file_hash

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "eval")


def bin_name(split: str) -> str:
    return f"{split}.bin"


def softmask_name(split: str) -> str:
    return f"{split}.softmask.bin"


class HashedFile:
    """An append-only output file with a running sha256 (fed by its user, see `append`); reopening at a
    checkpoint truncates to the recorded size and re-hashes the kept prefix, so a resumed run ends with the
    same bytes and digest."""

    def __init__(self, path: Path, keep: int = 0):
        self.path = path
        if keep and path.is_file() and path.stat().st_size >= keep:
            self.fh = open(path, "r+b")
            self.fh.truncate(keep)
            self.fh.seek(keep)
            self.hash = file_hash(path, "sha256", keep)
        else:
            self.fh = open(path, "wb")
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

    def __init__(self, folder: Path, split: str, keep: tuple[int, int] = (0, 0)):
        self.split = split
        self.ids = HashedFile(folder / bin_name(split), keep[0])
        self.soft = HashedFile(folder / softmask_name(split), keep[1])
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

    def _hash(self, item: tuple[np.ndarray, np.ndarray]) -> None:
        self.ids.hash.update(memoryview(item[0]))
        self.soft.hash.update(memoryview(item[1]))
        self._write_q.put(item)

    def _write(self, item: tuple[np.ndarray, np.ndarray]) -> None:
        self.ids.append(memoryview(item[0]), self.SYNC_BYTES)
        self.soft.append(memoryview(item[1]), self.SYNC_BYTES)
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

    def add(self, ids: np.ndarray, softmask_packed: np.ndarray) -> None:
        """Append one window: (L,) uint8 ids and its (L/8,) soft mask from np.packbits (big bit order:
        bit 7 of byte j is token 8j; np.unpackbits inverts it). The arrays must not be modified after
        (buffers from `buffers()` go back to the pool once written)."""
        self._raise()
        self._hash_q.put((np.ascontiguousarray(ids), np.ascontiguousarray(softmask_packed)))

    def drain(self) -> None:
        """Wait until every added window is hashed and written; re-raise an error of either."""
        self._hash_q.join()
        self._write_q.join()
        self._raise()

    def sizes(self) -> tuple[int, int]:
        self.drain()
        return self.ids.size, self.soft.size

    def digests(self) -> tuple[str, str]:
        self.drain()
        return self.ids.hash.hexdigest(), self.soft.hash.hexdigest()

    def flush(self) -> None:
        self.drain()
        self.ids.flush()
        self.soft.flush()

    def sync(self) -> None:
        self.drain()
        self.ids.sync()
        self.soft.sync()

    def files(self) -> dict[str, dict[str, Any]]:
        self.drain()
        return {f.path.name: {"bytes": f.size, "sha256": f.hash.hexdigest()} for f in (self.ids, self.soft)}

    def close(self) -> None:
        for q, t in zip((self._hash_q, self._write_q), self._threads, strict=True):
            if t.is_alive():
                q.put(None)
                t.join()
        self.ids.close()
        self.soft.close()


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
    """The manifest of a prepared folder; a one-line error when it is missing or unreadable."""
    p = Path(out_dir) / MANIFEST
    if not p.is_file():
        raise LcftError(f"{p.parent} is not a prepared windows folder (no {MANIFEST}; run `lcft prepare windows`)")
    try:
        m = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LcftError(f"{p}: corrupt manifest ({e})") from None
    if m.get("format_version") != FORMAT_VERSION:
        raise LcftError(f"{p}: format_version {m.get('format_version')!r}, this lcft reads {FORMAT_VERSION}")
    return m


class WindowSet:
    """The windows of one split, memory-mapped: ws[i] -> uint8 ids (length ws.length), ws.softmask(i),
    ws.coords(i) -> (chrom, start, end), 0-based end-exclusive in the FASTA record's coordinates."""

    def __init__(self, out_dir: str | os.PathLike, split: str):
        self.dir = Path(out_dir)
        self.manifest = read_manifest(self.dir)
        if split not in self.manifest["splits"]:
            raise LcftError(f"no split {split!r} in {self.dir} (have {', '.join(self.manifest['splits'])})")
        self.split = split
        self.length: int = self.manifest["length"]
        self.records: list[dict] = [r for r in self.manifest["records"] if r["split"] == split]
        n = len(self.records)
        self._ids = self._map(bin_name(split), n * self.length)
        self._soft = self._map(softmask_name(split), n * self.length // 8)

    def _map(self, name: str, size: int) -> np.ndarray:
        path = self.dir / name
        if not path.is_file():
            raise LcftError(f"{path} is missing (run `lcft prepare verify {self.dir}`)")
        if path.stat().st_size != size:
            raise LcftError(f"{path} has {path.stat().st_size} bytes, the manifest says {size} (corrupt)")
        if size == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))

    def __len__(self) -> int:
        return len(self.records)

    def _check(self, i: int) -> int:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} {self.split} windows")
        return i % len(self)

    def __getitem__(self, i: int) -> np.ndarray:
        i = self._check(i)
        return self._ids[i * self.length : (i + 1) * self.length]  # (L,) uint8 memmap view

    def softmask(self, i: int) -> np.ndarray:
        i = self._check(i)
        w = self.length // 8
        return np.unpackbits(self._soft[i * w : (i + 1) * w]).view(bool)  # (L,) True = lower case

    def coords(self, i: int) -> tuple[str, int, int]:
        r = self.records[self._check(i)]
        return r["chrom"], r["start"], r["end"]

    def __repr__(self) -> str:
        return f"WindowSet({str(self.dir)!r}, {self.split!r}: {len(self)} windows of {self.length})"


def open_windows(out_dir: str | os.PathLike, split: str) -> WindowSet:
    """The windows of `split` ('train' or 'eval') in a folder written by `prepare_windows`."""
    return WindowSet(out_dir, split)


def verify_windows(out_dir: str | os.PathLike) -> dict:
    """Recompute sizes and sha256 of every file the manifest lists; raise LcftError naming the first corrupt
    file. Returns the manifest."""
    d = Path(out_dir)
    m = read_manifest(d)
    for split, info in m["splits"].items():
        for name, meta in info["files"].items():
            p = d / name
            if not p.is_file():
                raise LcftError(f"{p} is missing ({split} split)")
            if p.stat().st_size != meta["bytes"]:
                raise LcftError(f"{p} is corrupt: {p.stat().st_size} bytes, manifest says {meta['bytes']}")
            if file_hash(p).hexdigest() != meta["sha256"]:
                raise LcftError(f"{p} is corrupt: sha256 differs from the manifest")
    return m
