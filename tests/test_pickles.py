"""The restricted unpickler every pickle we are handed goes through (lcft.pickles): what it admits is exactly
what its caller resolves, a persistent id is refused unless a caller reads them, and a memo index a pickle names
allocates nothing (the C unpickler sizes an array by it: 11 bytes naming index 10^9 took 15 GiB). Through DCP's
`.metadata` reader, its first user."""

from __future__ import annotations

import contextlib
import io
import pickle
import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from lcft.checkpoint.dcp_metadata import read_metadata_file
from lcft.errors import LcftError
from lcft.pickles import RestrictedUnpickler


def memo_put(index: int) -> bytes:
    """A protocol-4 pickle of None that stores it at memo `index` (LONG_BINPUT): 11 bytes."""
    return b"\x80\x04N" + b"r" + struct.pack("<I", index) + b"."


def test_globals_are_what_the_caller_resolves():
    data = pickle.dumps([torch.float16, torch.Size([2, 3])])
    allowed = {("torch", "float16"): torch.float16, ("torch", "Size"): torch.Size}
    assert RestrictedUnpickler(data, lambda m, n: allowed.get((m, n))).load() == [torch.float16, (2, 3)]
    with pytest.raises(pickle.UnpicklingError, match="refused global torch.Size"):
        RestrictedUnpickler(data, lambda m, n: torch.float16 if n == "float16" else None).load()
    with pytest.raises(pickle.UnpicklingError, match="refused global os.system"):
        RestrictedUnpickler(b"cos\nsystem\n(S'true'\ntR.", lambda m, n: None).load()


def test_a_persistent_id_is_refused():
    with pytest.raises(pickle.UnpicklingError):
        RestrictedUnpickler(b"\x80\x02X\x01\x00\x00\x000Q.", lambda m, n: None).load()


def test_a_refused_name_is_cut_short():
    name = "x" * 10_000
    with pytest.raises(pickle.UnpicklingError) as e:
        RestrictedUnpickler(b"c" + name.encode() + b"\ny\n.", lambda m, n: None).load()
    assert len(str(e.value)) < 120


def test_dcp_metadata_as_torch_writes_it_reads(tmp_path):
    md = Metadata(state_dict_metadata={})
    (tmp_path / ".metadata").write_bytes(pickle.dumps(md))
    assert read_metadata_file(tmp_path / ".metadata") == md  # the oracle: torch's own object, pickled by pickle


def traced_peak(call: Callable[[], Any]) -> int:
    """The most bytes Python's allocators held at once during `call()` (tracemalloc: what is asked for, whether
    or not the kernel has mapped it yet); what it raises is part of the call (each test checks that apart)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(Exception):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_memo_index_allocates_nothing(tmp_path):
    path = tmp_path / ".metadata"
    path.write_bytes(memo_put(10**7))
    c = traced_peak(lambda: pickle.Unpickler(io.BytesIO(path.read_bytes())).load())
    assert c > 100 << 20, c  # the oracle this guards against: the C unpickler sizes its memo by the index
    with pytest.raises(LcftError, match="not"):
        read_metadata_file(path)
    assert traced_peak(lambda: read_metadata_file(path)) < 1 << 20


def test_a_declared_bytearray_length_allocates_nothing():
    data = b"\x80\x05\x96" + struct.pack("<Q", 200 << 20) + b"."  # BYTEARRAY8 of 200 MiB, then nothing: 12 bytes
    stock = traced_peak(lambda: pickle._Unpickler(io.BytesIO(data)).load())  # the oracle: pickle's own allocates
    assert stock > 200 << 20, stock
    with pytest.raises(pickle.UnpicklingError, match="runs past the end"):
        RestrictedUnpickler(data, lambda m, n: None).load()
    assert traced_peak(lambda: RestrictedUnpickler(data, lambda m, n: None).load()) < 1 << 20
    whole = pickle.dumps([bytearray(b"abc"), b"x"], protocol=5)  # what the opcode is for still reads
    assert RestrictedUnpickler(whole, lambda m, n: None).load() == [bytearray(b"abc"), b"x"]


def shared(levels: int) -> list:
    """A list holding itself twice, `levels` deep: a few bytes pickled, 2**levels items to a plain repr."""
    x: list = []
    for _ in range(levels):
        x = [x, x]
    return x


@pytest.mark.parametrize("dtype", [10**5000, shared(40), "x" * 1_000_000], ids=["5000-digit", "shared", "1MB-str"])
def test_a_crafted_dtype_is_a_short_line(tmp_path, dtype):
    """The refusal names what the file holds without building its repr (a 5000-digit int cannot be printed, a
    shared list of 40 levels would print 2**40 items)."""
    props = TensorProperties()
    props.dtype = dtype
    md = Metadata(state_dict_metadata={"w" * 10_000: TensorStorageMetadata(props, torch.Size([2]), [])})
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(md))
    assert len(path.read_bytes()) < 1_100_000
    with pytest.raises(LcftError) as e:
        read_metadata_file(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "not a floating-point torch dtype" in msg and len(msg) < 400, msg


def test_a_declared_length_past_the_file_is_one_line(tmp_path):  # BINBYTES8 reads before it builds
    path = tmp_path / ".metadata"
    path.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"ab")  # BINBYTES8 of 2**62 bytes
    with pytest.raises(LcftError) as e:
        read_metadata_file(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def reduce_call(module: str, name: str, *args: bytes) -> bytes:
    """A protocol-2 pickle that calls global `module.name` with the pickled `args` (GLOBAL, a tuple, REDUCE)."""
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"(" + b"".join(args) + b"tR."


@pytest.mark.parametrize("data, kind", [
    (reduce_call("torch", "Size", b"\x88"), "corrupt (TypeError)"),  # torch.Size(True): raised in C, called by pickle
    (reduce_call("pathlib", "PosixPath", b"K\x01"), "corrupt (TypeError)"),  # PosixPath(1): raised inside pathlib
    (b"\x80\x02\x94.", "corrupt (IndexError)"),  # MEMOIZE on an empty stack
    (b"\x80\x02h\x05.", "Memo value not found"),  # BINGET of a memo entry never put
    (b"\x80\x02J\x01\x00", "corrupt (struct.error)"),  # BININT cut short
    (b"\x80\x05\x96\x01\x00\x00", "runs past the end"),  # BYTEARRAY8 whose length is cut short
], ids=["C call", "stdlib class", "memoize", "memo", "short int", "short length"])
def test_a_crafted_or_torn_pickle_is_one_line(tmp_path, data, kind):
    """What the parser (pickle, and the classes it may build with) raises for a crafted or torn file is one
    line naming the file."""
    path = tmp_path / ".metadata"
    path.write_bytes(data)
    with pytest.raises(LcftError) as e:
        read_metadata_file(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    assert kind in msg, msg


def test_a_fault_of_lcft_inside_the_read_keeps_its_traceback(tmp_path, monkeypatch):
    """An error raised by lcft's own code while a file is read (here: the metadata's globals resolved by a
    function that breaks) is a bug of lcft, not of the file: it propagates as itself, with its traceback."""
    import lcft.checkpoint.dcp_metadata as dcp_metadata

    def broken(module: str, name: str) -> Any:
        return {}[module]  # a contract of ours broken: a KeyError, whatever the file holds

    path = tmp_path / ".metadata"
    whole = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2]))
    path.write_bytes(pickle.dumps(Metadata(
        state_dict_metadata={"w": TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), [whole])},
        storage_data={MetadataIndex("w", whole.offsets): _StorageInfo("__0_0.distcp", 0, 8)})))
    assert read_metadata_file(path).state_dict_metadata  # read whole as it is
    monkeypatch.setattr(dcp_metadata, "_metadata_global", broken)
    with pytest.raises(KeyError) as e:
        read_metadata_file(path)
    assert e.traceback[-1].name == "broken"
