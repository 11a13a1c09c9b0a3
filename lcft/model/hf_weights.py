"""The weight files of a HuggingFace model folder, read without running anything from them: per file (which files:
lcft.model.weight_files), each tensor's name, shape and reader.

A pytorch_model.bin (torch.save's zip) is not given to torch.load: its data.pkl is read by lcft.pickles'
restricted unpickler building no torch object (its globals are OrderedDict, torch's `_rebuild_tensor_v2`, which
becomes a record of the view it declares, and the floating-point storage types, which become dtypes). Every
storage, offset, shape and stride it declares is checked against the zip's own records (lcft.torch_zip: each
stored inside the file, uncompressed) before a byte of weights is read; a tensor is then copied, when it is asked
for, from a private memory map of the file into memory of its own, so two never share memory and what is
allocated is what the tensor's shape takes."""

from __future__ import annotations

import mmap
import pickle
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import torch

from lcft.errors import LcftError, shown
from lcft.model.weight_files import header_dtypes, safe_opened
from lcft.pickles import RestrictedUnpickler, reading
from lcft.torch_zip import Record, stored_records

MAX_PICKLE_BYTES = 16 << 20  # a pytorch_model.bin's data.pkl: ~200 bytes a tensor
MAX_DIMS = 16
ALIGN = 64  # bytes: where torch's CPU allocator starts every tensor it allocates
_FLOAT_STORAGES = {"FloatStorage": torch.float32, "HalfStorage": torch.float16,
                   "BFloat16Storage": torch.bfloat16, "DoubleStorage": torch.float64}

Reader = Callable[[], torch.Tensor]


def weight_tensors(f: Path) -> Iterator[tuple[str, tuple[int, ...], Reader]]:
    """(name, shape, read) per tensor of a weight file; read() gives the tensor, read then into contiguous memory
    of its own. A safetensors header's dtypes are checked first (`header_dtypes`), before safetensors reads it."""
    if f.suffix == ".bin":
        yield from _bin_tensors(f)
        return
    header_dtypes(f)
    with safe_opened(f) as sf:
        for key in sf.keys():  # noqa: SIM118 (safe_open is not a dict)
            yield key, tuple(sf.get_slice(key).get_shape()), lambda key=key: sf.get_tensor(key)


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, copied when its memory does not start on an ALIGN-byte boundary (safetensors hands CPU tensors
    out 8 bytes past one). CPU matmul kernels round differently on such operands, so a model read from a file
    must sit where one built in memory sits: else a run resumed from its checkpoint drifts from the run that
    never stopped in the last bits of its gradients."""
    return tensor if tensor.data_ptr() % ALIGN == 0 else tensor.clone()


class _Storage(NamedTuple):
    key: str
    dtype: torch.dtype
    numel: int


class _Tensor(NamedTuple):
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _StorageType(NamedTuple):
    """What a storage class named in data.pkl stands for: its dtype (never the class, so never called)."""

    dtype: torch.dtype


def _whole(x: Any) -> bool:
    return type(x) is int and 0 <= x < 2**63


class _StateDictUnpickler(RestrictedUnpickler):
    """An unpickler admitting only what torch.save writes for a state dict of floating-point tensors, building
    none of them: each tensor becomes a `_Tensor` record, checked against the zip's storage records `sizes`
    {key: bytes}."""

    def __init__(self, data: bytes, sizes: dict[str, int]) -> None:
        super().__init__(data, self._global)
        self.sizes = sizes
        self.storages: dict[str, _Storage] = {}

    def _global(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self._declare
        if module == "torch" and name in _FLOAT_STORAGES:
            return _StorageType(_FLOAT_STORAGES[name])
        return None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
                and type(pid[2]) is str and _whole(pid[4])):
            raise pickle.UnpicklingError(f"persistent id {shown(pid)} is not a floating-point storage")
        storage = _Storage(pid[2], pid[1].dtype, pid[4])
        if self.storages.setdefault(storage.key, storage) != storage:
            raise pickle.UnpicklingError(f"storage {shown(storage.key)} is declared twice, differently")
        if self.sizes.get(storage.key) != storage.numel * storage.dtype.itemsize:
            raise pickle.UnpicklingError(f"storage {shown(storage.key)} of {storage.numel} x {storage.dtype} "
                                         f"does not match the file's record ({self.sizes.get(storage.key)} bytes)")
        return storage

    def _declare(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any,
                 metadata: Any = None) -> _Tensor:
        if not (isinstance(storage, _Storage) and _whole(offset) and type(size) is tuple and type(stride) is tuple
                and len(size) == len(stride) <= MAX_DIMS and all(map(_whole, size + stride))
                and type(requires_grad) is bool and not hooks and not metadata):
            raise pickle.UnpicklingError("a tensor record is not a plain strided tensor")
        if 0 not in size and offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) >= storage.numel:
            raise pickle.UnpicklingError(f"a tensor of shape {size} reaches past its storage of {storage.numel}")
        return _Tensor(storage, offset, size, stride)


def _bad_bin(f: Path, why: str) -> LcftError:
    return LcftError(f"{f}: cannot read weights ({why}; nothing in the file was run)")


def _bin_tensors(f: Path) -> Iterator[tuple[str, tuple[int, ...], Reader]]:
    with reading(f, lambda why: _bad_bin(f, why)), open(f, "rb") as fh:
        data, records = _zip_records(f, fh)
        state = _StateDictUnpickler(data, {k: r.size for k, r in records.items()}).load()
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)  # private: writes never reach the file
    if type(state) not in (dict, OrderedDict) or not all(
            type(k) is str and isinstance(t, _Tensor) for k, t in state.items()):
        raise _bad_bin(f, "not a state dict of tensors")
    for key, t in state.items():
        yield key, t.size, lambda t=t: _read(mm, records[t.storage.key], t)


def _read(mm: mmap.mmap, record: Record, t: _Tensor) -> torch.Tensor:
    """The tensor `t` declares, copied into contiguous memory of its own: a view sharing its storage with another
    tensor, or repeating rows by a zero stride, becomes a tensor like any other (torch's load_state_dict copies
    each stored tensor into its parameter too). Only the span of the storage it views is read, and its pages of
    the map are dropped after, so a load holds one model plus one tensor; a shape beyond the span, by zero
    strides, is the shape its parameter takes anyway (checked against config.json before it is read)."""
    if 0 in t.size:
        return torch.empty(t.size, dtype=t.storage.dtype)
    nbytes = t.storage.dtype.itemsize * (1 + sum((n - 1) * s for n, s in zip(t.size, t.stride, strict=True)))
    first = record.start + t.offset * t.storage.dtype.itemsize  # the view lies inside its storage: checked
    base = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=first).clone().view(t.storage.dtype)
    page = first - first % mmap.PAGESIZE
    mm.madvise(mmap.MADV_DONTNEED, page, first + nbytes - page)  # clean pages of the file: read again if needed
    view = base.as_strided(t.size, t.stride)
    return base.view(t.size) if view.is_contiguous() and view.numel() == base.numel() else \
        view.clone(memory_format=torch.contiguous_format)


def _zip_records(f: Path, fh: BinaryIO) -> tuple[bytes, dict[str, Record]]:
    """(data.pkl's bytes, {storage key: its Record}) of torch.save's zip (lcft.torch_zip.stored_records: every
    record stored inside the file), data.pkl at most MAX_PICKLE_BYTES and the storages little-endian."""
    records = stored_records(fh, lambda why: _bad_bin(f, why))
    pkl = [name for name in records if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(pkl) != 1 or records[pkl[0]].size > MAX_PICKLE_BYTES:
        raise _bad_bin(f, f"no single data.pkl of at most {MAX_PICKLE_BYTES >> 20} MiB")
    prefix = pkl[0][:-len("data.pkl")]
    order = records.get(prefix + "byteorder")
    if order and (order.size > 16 or _bytes(fh, order) != b"little"):
        raise _bad_bin(f, "tensors not stored little-endian")
    storages = {name[len(prefix) + 5:]: r for name, r in records.items() if name.startswith(prefix + "data/")}
    return _bytes(fh, records[pkl[0]]), storages


def _bytes(fh: BinaryIO, record: Record) -> bytes:
    fh.seek(record.start)
    return fh.read(record.size)
