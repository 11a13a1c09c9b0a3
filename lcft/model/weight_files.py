"""Which weight files a HuggingFace model folder's model is read from (model.safetensors, or the shards its index
names, each a plain file of the folder; pytorch_model.bin only where a folder has no safetensors), and the dtype
their safetensors headers declare: without torch, so a check before a command's work may ask; and the one opening
of a safetensors file for its tensors."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lcft.errors import LcftError, reason, shown
from lcft.files import MAX_MODEL_JSON_BYTES, is_plain_name, parse_json, present, read_json

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_WEIGHTS, TORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"  # read only without safetensors
MAX_SHARDS = 100_000  # shard files an index may name (the largest published models use a few hundred)
MAX_HEADER_BYTES = 100_000_000  # a safetensors header: the safetensors library's own limit
# safetensors' dtype codes of the floating-point weights lcft reads, as torch names the dtypes
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def weight_files(directory: Path) -> list[Path]:
    """The weight file(s) of a folder: model.safetensors, or the shards its index names (all present); only
    where a folder has no safetensors, pytorch_model.bin (or its index's shards)."""
    return _weights(directory)[0]


def weight_sources(directory: Path) -> list[Path]:
    """Every file a read of the folder's weights opens: the index, where the weights are sharded, and
    `weight_files`."""
    files, index = _weights(directory)
    return ([index] if index is not None else []) + files


def index_map(directory: Path) -> tuple[Path, Mapping[str, str]] | None:
    """(the index, its weight_map: tensor name -> shard file) of a folder whose weights are sharded, its shards
    checked as `weight_files` checks them; None where they are one file."""
    index = _weights(directory)[1]
    return None if index is None else (index, _weight_map(index))


def _weights(directory: Path) -> tuple[list[Path], Path | None]:
    """(`weight_files`, the index that names them or None)."""
    for single, index in ((WEIGHTS, INDEX), (TORCH_WEIGHTS, TORCH_INDEX)):
        if present(directory / single):  # (one that is no file: refused, not passed over for another)
            return [directory / single], None
        if present(directory / index):
            return [directory / s for s in _index_shards(directory / index)], directory / index
    raise LcftError(f"{directory}: no {WEIGHTS} (or sharded {INDEX}) found")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the filesystem
        return False


def _index_shards(index: Path) -> list[str]:
    """The distinct shard files an index's weight_map names: plain file names of its folder, all present."""
    shards = sorted(set(_weight_map(index).values()))
    missing = [s for s in shards if not _is_file(index.parent / s)]
    if missing:
        names = ", ".join(shown(s, 120) for s in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise LcftError(f"{index.parent}: {len(missing)} of {len(shards)} weight shard(s) missing: {names}")
    return shards


def _weight_map(index: Path) -> Mapping[str, str]:
    """The index's weight_map, parsed once for each version of the file (its path and stat): a command asks for
    the weights' files several times (the check before its work, the header check, the load, an export's dtype)."""
    try:
        st = index.stat()
    except OSError:  # gone or unreadable: read_json says so in one line
        return _parse_index(index)
    return _cached_index(index, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


@functools.lru_cache(maxsize=2)  # the folder a command reads (and, for an export over one, the other)
def _cached_index(index: Path, version: tuple[int, ...]) -> Mapping[str, str]:
    return _parse_index(index)


def _parse_index(index: Path) -> Mapping[str, str]:
    """An index's weight_map: an object of tensor names, naming plain files of its folder, at most MAX_SHARDS."""
    weight_map = read_json(index, limit=MAX_MODEL_JSON_BYTES).get("weight_map", {})
    if not isinstance(weight_map, dict):
        raise LcftError(f"{index}: 'weight_map' is not an object of tensor name -> shard file")
    for name in weight_map.values():
        if not is_plain_name(name):
            raise LcftError(f"{index}: names shard {shown(name, quoted=True)}, which is not a file of its folder (refused)")
    shards = set(weight_map.values())
    if not shards:
        raise LcftError(f"{index}: the index names no weight shard")
    if len(shards) > MAX_SHARDS:
        raise LcftError(f"{index}: names {len(shards)} shard files (at most {MAX_SHARDS} are read)")
    return MappingProxyType(weight_map)


def stored_dtype(files: list[Path]) -> str | None:
    """The dtype (torch's name) the weight files `files` are saved in as stored (`common_dtype` of those their
    safetensors headers declare: no tensor is read; one lcft does not read as weights is refused, `header_dtypes`);
    None where they hold no tensor, or where one is a pytorch_model.bin (whose dtypes only its pickle, read with
    torch, tells)."""
    found: set[str] = set()
    for f in files:
        if f.suffix != ".safetensors":
            return None
        found |= set(header_dtypes(f).values())
    return common_dtype(found)


def common_dtype(dtypes: Iterable[str]) -> str | None:
    """The dtype (torch's name, of SAFETENSORS_DTYPES') a model whose weights are of `dtypes` is saved in as stored:
    the narrowest holding every value of each exactly, as torch.promote_types gives it (their one dtype, else
    float64 among them, else float32: bfloat16 and float16 each hold values the other cannot). One, because
    config.json names one and transformers loads every weight in it (a bfloat16 config truncated a float32 weight
    saved beside it). None for no dtype."""
    found = set(dtypes)
    if len(found) <= 1:
        return next(iter(found), None)
    return "float64" if "float64" in found else "float32"


def header_dtypes(f: Path) -> dict[str, str]:
    """{tensor name: its dtype, torch's name} as the header of the safetensors file `f` declares them (no tensor is
    read): the one reader of a header's dtypes, each entry checked to be an object naming its dtype by a string (a
    list there is no dtype, and safetensors itself has not looked at the header yet) and that dtype one lcft reads
    as weights (SAFETENSORS_DTYPES: an integer, bool or FP8 tensor would be cast as read, FP8 without the scales
    its checkpoint keeps beside it), else one line naming the file, the tensor and its dtype."""
    dtypes = {}
    for key, entry in _header(f).items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise LcftError(f"{f}: cannot read weights (the header's entry of tensor {shown(key, quoted=True)} is "
                            f"{shown(entry)}, not an object)")
        code = entry.get("dtype")
        if not isinstance(code, str):
            raise LcftError(f"{f}: cannot read weights (tensor {shown(key, quoted=True)} declares dtype "
                            f"{shown(code)}, not a dtype's name)")
        if code not in SAFETENSORS_DTYPES:
            raise LcftError(f"{f}: weight {shown(key, quoted=True)} is stored as {shown(code, 20, quoted=True)}; "
                            f"lcft reads weights stored as {', '.join(SAFETENSORS_DTYPES)} "
                            f"({', '.join(SAFETENSORS_DTYPES.values())})")
        dtypes[key] = SAFETENSORS_DTYPES[code]
    return dtypes


def _header(f: Path) -> dict:
    """The JSON header of the safetensors file `f` (its declared length bounded before it is read)."""
    try:
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if size > MAX_HEADER_BYTES:
                raise LcftError(f"{f}: cannot read weights (a header of {size} bytes declared; at most "
                                f"{MAX_HEADER_BYTES})")
            # a header longer than the file is garbled (below): not read, so no buffer of its declared size is asked
            raw = fh.read(size) if size <= os.fstat(fh.fileno()).st_size - 8 else b""
    except OSError as e:
        raise LcftError(f"{f}: cannot read weights ({reason(e)})") from None
    try:
        header = parse_json(raw.decode() if len(raw) == size else "", str(f))
    except (UnicodeDecodeError, LcftError):
        header = None
    if not isinstance(header, dict):
        raise LcftError(f"{f}: cannot read weights (no safetensors header)")
    return header


@contextmanager
def safe_opened(f: Path) -> Iterator[Any]:
    """safetensors' reader of the file `f` (torch tensors). safetensors takes only a UTF-8 path; a name that is not
    (a folder named with byte 0xff on Linux) is opened here and handed over as its descriptor's /proc/self/fd
    link, the same file."""
    from safetensors import safe_open

    try:
        str(f).encode()
    except UnicodeEncodeError:
        pass
    else:
        with safe_open(str(f), framework="pt") as sf:
            yield sf
        return
    if not os.path.isdir("/proc/self/fd"):
        raise LcftError(f"{f}: cannot read weights (the name is not valid UTF-8, which safetensors cannot open): "
                        "rename the file or folder")
    try:
        fd = os.open(f, os.O_RDONLY)
    except OSError as e:
        raise LcftError(f"{f}: cannot read weights ({reason(e)})") from None
    try:
        with safe_open(f"/proc/self/fd/{fd}", framework="pt") as sf:
            yield sf
    finally:
        os.close(fd)
