"""A zip archive of torch.save (a pytorch_model.bin, a trainer state's .pt files) checked before a byte of it is
read: its record count and directory bounded, and every record stored as it is (neither compressed nor
encrypted) inside the file, so reading any record, by lcft or by torch.load, allocates at most the file's own
size (torch.save compresses nothing; a deflated record of zeros grows a thousandfold as it is read)."""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Callable
from typing import BinaryIO, NamedTuple

from lcft.errors import shown

MAX_ZIP_RECORDS = 100_000  # records of torch.save's zip: one a storage, plus a few
MAX_ZIP_DIRECTORY = 16 << 20  # bytes of its zip directory: ~100 a record
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


class Record(NamedTuple):
    """Where a stored record's bytes lie in the file."""

    start: int
    size: int


def stored_records(fh: BinaryIO, bad: Callable[[str], Exception]) -> dict[str, Record]:
    """{name: Record} of every record of the zip archive open in `fh` (at most MAX_ZIP_RECORDS in a directory of
    at most MAX_ZIP_DIRECTORY bytes), each stored uncompressed and unencrypted within the file; else `bad(why)`
    is raised."""
    end = zipfile._EndRecData(fh)
    if end is None:
        raise bad("not a zip archive of torch.save; an older torch format is not read")
    if end[zipfile._ECD_ENTRIES_TOTAL] > MAX_ZIP_RECORDS or end[zipfile._ECD_SIZE] > MAX_ZIP_DIRECTORY:
        raise bad(f"a zip directory of {end[zipfile._ECD_ENTRIES_TOTAL]} records in {end[zipfile._ECD_SIZE]} "
                  f"bytes (at most {MAX_ZIP_RECORDS} in {MAX_ZIP_DIRECTORY})")
    total = os.fstat(fh.fileno()).st_size
    records = {}
    for info in zipfile.ZipFile(fh).infolist():  # every entry, a name given twice included
        head = b""
        if info.header_offset >= 0:  # zipfile subtracts the bytes it takes to stand before the archive: may be < 0
            fh.seek(info.header_offset)
            head = fh.read(_LOCAL_HEADER)
        if len(head) < _LOCAL_HEADER or head[:4] != b"PK\x03\x04":
            raise bad(f"record {shown(info.filename)} has no local header")
        start = info.header_offset + _LOCAL_HEADER + sum(struct.unpack("<HH", head[26:30]))
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1 or info.compress_size != info.file_size \
                or start + info.file_size > total:
            raise bad(f"record {shown(info.filename)} is compressed, encrypted or past the file's end: torch.save "
                      "stores every record as it is")
        records[info.filename] = Record(start, info.file_size)
    return records
