"""Reading torch.distributed.checkpoint (DCP) folders without running code from them: its `.metadata` (a pickle
torch reads with plain `pickle.load`) is read by lcft.pickles' restricted unpickler, admitting only DCP's metadata
classes, torch's sizes, dtypes and layouts, and paths; the load planner refuses the pickled "bytes" entries DCP
would load with `torch.load(weights_only=False)`. lcft never stores such entries (non-tensor optimizer state is JSON)."""

from __future__ import annotations

import importlib
import io
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_md
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from lcft.errors import LcftError, shown
from lcft.files import is_plain_name
from lcft.pickles import RestrictedUnpickler, reading

METADATA = ".metadata"
MAX_METADATA_BYTES = 512 << 20  # ~100 bytes a shard of a tensor: far above any model lcft trains

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
    floating-point torch dtype and every shard file it names is a plain file name inside its folder. A one-line
    LcftError naming the file otherwise."""
    path = Path(path)
    with reading(path, lambda why: _refuse(path, why)), open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > MAX_METADATA_BYTES:
            raise _refuse(path, f"larger than {MAX_METADATA_BYTES >> 20} MiB")
        md = RestrictedUnpickler(fh.read(), _metadata_global).load()
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


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner that never unpickles a bytes entry (DCP would use weights_only=False)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise LcftError(f"sharded checkpoint entry {read_item.dest_index.fqn!r} is pickled data; refused "
                        "(lcft stores only tensors in dcp/)")
