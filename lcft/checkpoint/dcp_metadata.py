"""Reading torch.distributed.checkpoint (DCP) folders without running code from them: its `.metadata` (a pickle
torch reads with plain `pickle.load`) is read by lcft.pickles' restricted unpickler, admitting only DCP's metadata
classes, torch's sizes, dtypes and layouts, and paths; the load planner refuses the pickled "bytes" entries DCP
would load with `torch.load(weights_only=False)`. lcft never stores such entries (non-tensor optimizer state is JSON).
Each item DCP torch.loads from a shard file is first checked as lcft.torch_zip checks a torch.save zip."""

from __future__ import annotations

import importlib
import io
import itertools
import math
import os
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint.metadata as dcp_md
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from lcft.checkpoint.model_files import METADATA
from lcft.errors import LcftError, shown
from lcft.files import is_plain_name, read_capped
from lcft.pickles import RestrictedUnpickler, reading
from lcft.torch_zip import stored_records

MAX_METADATA_BYTES = 512 << 20  # ~100 bytes a shard of a tensor: far above any model lcft trains
MAX_CHUNKS = 1 << 16  # chunks of one tensor: one per rank that held a part of it
MAX_SPLIT_DIMS = 4  # dims of one tensor its chunks cut (a box has 2^dims corners); a device mesh dim cuts one

# Every global a `.metadata` torch writes names (module, name); torch dtypes are admitted by type below.
_ALLOWED = {
    *(("torch.distributed.checkpoint.metadata", n) for n in (*dcp_md.__all__, "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


def _metadata_global(module: str, name: str) -> Any:
    """The object a `.metadata` global stands for: `_ALLOWED` (imported as pickle would) and torch dtypes only."""
    if (module, name) in _ALLOWED:
        return getattr(importlib.import_module(module), name)
    found = getattr(torch, name, None) if module == "torch" else None
    return found if isinstance(found, torch.dtype) else None


def _refuse(path: Path, why: str) -> LcftError:
    return LcftError(f"{path}: refused: {why} (not the metadata of a sharded checkpoint; nothing in it was run)")


def read_metadata_file(path: str | os.PathLike) -> dcp_md.Metadata:
    """The DCP Metadata in `path`, read with the restricted unpickler and checked: every tensor entry has a
    floating-point torch dtype, every shard file it names is a plain file name inside its folder, and the chunks
    of each tensor cover it exactly once from stored data that fits in their files (`_check_chunks`). A
    one-line LcftError naming the file otherwise."""
    path = Path(path)
    with reading(path, lambda why: _refuse(path, why)), open(path, "rb") as fh:
        if (size := os.fstat(fh.fileno()).st_size) > MAX_METADATA_BYTES:
            raise _refuse(path, f"larger than {MAX_METADATA_BYTES >> 20} MiB")
        data = read_capped(fh, size, MAX_METADATA_BYTES)  # whatever its size said a moment ago: one grown is refused
        if len(data) > MAX_METADATA_BYTES:
            raise _refuse(path, f"larger than {MAX_METADATA_BYTES >> 20} MiB")
        md = RestrictedUnpickler(data, _metadata_global).load()
    _check(path, md)
    return md


def _check(path: Path, md: Any) -> None:
    # An unpickled object holds only the attributes its file gave (BUILD sets them): each is read with getattr.
    entries = getattr(md, "state_dict_metadata", None) if isinstance(md, dcp_md.Metadata) else None
    storage = getattr(md, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict | None):
        raise _refuse(path, "it holds no DCP Metadata")
    kinds = (dcp_md.TensorStorageMetadata, dcp_md.BytesStorageMetadata)
    if not all(isinstance(k, str) and isinstance(v, kinds) for k, v in entries.items()):
        raise _refuse(path, "an entry is not tensor metadata")
    for key, v in entries.items():  # lcft stores weights and AdamW state: floating point only
        if not isinstance(v, dcp_md.TensorStorageMetadata):
            continue
        props = getattr(v, "properties", None)
        dtype = getattr(props, "dtype", None) if isinstance(props, dcp_md.TensorProperties) else None
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            named = dtype if isinstance(dtype, torch.dtype) else shown(dtype)  # torch's own dtypes name themselves
            raise _refuse(path, f"tensor {shown(key, quoted=True)} has dtype {named}, not a floating-point torch dtype")
    for info in (storage or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or not is_plain_name(name) or getattr(info, "transform_descriptors", None):
            raise _refuse(path, f"shard file {shown(name, quoted=True)} is not a plain file of its folder")
    reach: dict[str, int] = {}  # shard file -> the end of the last data the metadata places in it
    for key, v in entries.items():
        if isinstance(v, dcp_md.TensorStorageMetadata):
            _check_chunks(path, key, v, storage or {}, reach)
    for name, end in reach.items():
        try:
            size = (path.parent / name).stat().st_size
        except OSError:  # missing: the caller names every missing shard file
            continue
        if size < end:
            raise LcftError(f"unreadable checkpoint {path.parent.parent}: {path.parent.name}/{name} holds {size} "
                            f"bytes, fewer than the {end} its metadata places there (the file was cut short?)")


def _ints(x: Any, n: int) -> tuple[int, ...] | None:
    """`x` as n whole numbers >= 0 (a torch.Size, as torch writes them), else None."""
    ok = isinstance(x, tuple) and len(x) == n and all(type(i) is int and i >= 0 for i in x)
    return x if ok else None


def _check_chunks(path: Path, key: str, v: Any, storage: dict, reach: dict[str, int]) -> None:
    """The chunks of tensor `key` lie inside it, do not overlap and add up to it (so each element is read
    exactly once: a missing chunk left memory as it was, read as weights), and each one's stored bytes are at
    least its elements'; `reach` gets where each file's data ends, which the caller holds against the file (so
    the sizes a file declares are bounded by the bytes there are, before anything is allocated for them)."""
    size = getattr(v, "size", None)
    shape, chunks = _ints(size, len(size)) if isinstance(size, tuple) else None, getattr(v, "chunks", None)
    name = shown(key, quoted=True)
    if shape is None or not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        raise _refuse(path, f"tensor {name} has no size and list of chunks")
    itemsize, boxes, total = v.properties.dtype.itemsize, [], 0
    for c in chunks:
        off, size = _ints(getattr(c, "offsets", None), len(shape)), _ints(getattr(c, "sizes", None), len(shape))
        if off is None or size is None or any(o + s > n for o, s, n in zip(off, size, shape, strict=True)):
            raise _refuse(path, f"a chunk of tensor {name} lies outside its size {list(shape)}")
        info = storage.get(dcp_md.MetadataIndex(key, off))
        if info is None:
            raise _refuse(path, f"a chunk of tensor {name} has no stored data")
        numel = math.prod(size)
        if not (type(info.offset) is int and type(info.length) is int and 0 <= info.offset
                and numel * itemsize <= info.length):
            raise _refuse(path, f"a chunk of tensor {name} ({numel} elements of {itemsize} bytes) has stored data of "
                          f"{shown(getattr(info, 'length', None))} bytes")
        reach[info.relative_path] = max(reach.get(info.relative_path, 0), info.offset + info.length)
        total += numel
        if numel:
            boxes.append((off, size))
    split = [d for d in range(len(shape)) if any(s[d] != shape[d] for _, s in boxes)]
    if len(split) > MAX_SPLIT_DIMS:
        raise _refuse(path, f"the chunks of tensor {name} cut it along {len(split)} dims (at most {MAX_SPLIT_DIMS})")
    if total != math.prod(shape) or (total and not _tiles(shape, boxes, split)):
        raise _refuse(path, f"the chunks of tensor {name} do not cover its size {list(shape)} once")


def _tiles(shape: tuple[int, ...], boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], split: list[int]) -> bool:
    """Whether boxes (offsets, sizes), each non-empty and inside `shape`, their elements adding up to its, cover
    it once: exactly when the box corners that occur an odd number of times are the corners of `shape` itself.
    Why: the mixed difference along every dim of a box's indicator is +-1 at its 2^d corners and 0 elsewhere, so
    the parity condition makes (coverage - 1) even at every element, each element is covered an odd number of
    times, and with the element counts equal, once. One pass over the boxes' corners, whatever their layout (a
    pairwise comparison costs the square of the chunks sharing a row); only the `split` dims, those some box does
    not span whole, have two corner coordinates."""
    odd: set[tuple[int, ...]] = set()
    for off, size in boxes:
        for corner in itertools.product(*((off[d], off[d] + size[d]) for d in split)):
            odd.symmetric_difference_update((corner,))
    return odd == set(itertools.product(*((0, shape[d]) for d in split)))


class SafeReader(FileSystemReader):
    """DCP's FileSystemReader with `read_metadata_file` in place of its plain pickle.load."""

    refusal: LcftError | None = None
    """The refusal read_metadata raised: torch before 2.13 catches it and fails with "metadata is None"."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_md.Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata files: lcft writes one .metadata only
            raise LcftError(f"{self.path}: per-rank DCP metadata is not read")
        try:
            md = read_metadata_file(Path(self.path) / METADATA)
        except LcftError as e:
            self.refusal = e
            raise
        md.storage_meta = dcp_md.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def _slice_file(self, file: IO[bytes], sinfo: _StorageInfo) -> IO[bytes]:
        """DCP's view of one item's bytes, which it then torch.loads whole: its records stored within those bytes
        first (a record deflated there, a thousandfold smaller than its zeros, would be inflated whole)."""
        path = Path(self.path) / sinfo.relative_path
        where = f"bytes {sinfo.offset}-{sinfo.offset + sinfo.length}"
        stored_records(file, lambda why: LcftError(f"{path}: the item at {where} is refused: {why}"),
                       span=(sinfo.offset, sinfo.length))
        return super()._slice_file(file, sinfo)


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner that never unpickles a bytes entry (DCP would use weights_only=False)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise LcftError(f"sharded checkpoint entry {read_item.dest_index.fqn!r} is pickled data; refused "
                        "(lcft stores only tensors in dcp/)")
