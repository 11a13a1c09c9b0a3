"""A zip archive of torch.save (a pytorch_model.bin, a trainer state's .pt files) checked before a byte of it is
read: its record count and directory bounded, and every record stored as it is (neither compressed nor
encrypted) inside the file, so reading any record, by lcft or by torch.load, allocates at most the file's own
size (torch.save compresses nothing; a deflated record of zeros grows a thousandfold as it is read). The archive may
also be a span of a larger file: DCP's shard files hold one torch.save zip per tensor item, each torch.load-ed whole."""

from __future__ import annotations

import errno
import io
import os
import struct
import zipfile
from collections.abc import Callable
from typing import BinaryIO, NamedTuple

from lcft.errors import reason, shown

MAX_ZIP_RECORDS = 100_000  # records of torch.save's zip: one a storage, plus a few
MAX_ZIP_DIRECTORY = 16 << 20  # bytes of its zip directory: ~100 a record
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field
_LOCAL_MAGIC = b"PK\x03\x04"  # how a local file header, and so every torch.save zip, starts


class Record(NamedTuple):
    """Where a stored record's bytes lie in the file."""

    start: int
    size: int


class _Span(io.RawIOBase):
    """Bytes [start, start + size) of an open binary file, read as a file of their own (zipfile finds an archive
    from its end, so it must see where the span ends)."""

    def __init__(self, fh: BinaryIO, start: int, size: int) -> None:
        super().__init__()
        self.fh, self.start, self.size, self.pos = fh, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        pos = offset + (0, self.pos, self.size)[whence]
        if pos < 0:  # as a file does: zipfile takes it for a file too short to be an archive
            raise OSError(errno.EINVAL, "negative seek position")
        self.pos = pos
        return pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: bytearray | memoryview) -> int:
        self.fh.seek(self.start + self.pos)
        n = self.fh.readinto(memoryview(b)[:max(0, self.size - self.pos)])  # type: ignore[attr-defined]
        self.pos += n or 0
        return n or 0


def stored_records(fh: BinaryIO, bad: Callable[[str], Exception],
                   span: tuple[int, int] | None = None) -> dict[str, Record]:
    """{name: Record} of every record of the zip archive open in `fh` (at most MAX_ZIP_RECORDS in a directory of
    at most MAX_ZIP_DIRECTORY bytes), each stored uncompressed and unencrypted within the file; else `bad(why)`
    is raised. span: (start, size), the archive is those bytes of the file, and Records are placed within them."""
    if span is not None:
        if span[0] + span[1] > fh.seek(0, os.SEEK_END):  # (the span's own end is where zipfile looks)
            raise bad(f"bytes {span[0]}-{span[0] + span[1]} run past the file's end")
        fh = _Span(fh, *span)  # type: ignore[assignment]
    fh.seek(0)
    # torch.load takes a file for its zip format by its first bytes, zipfile finds the archive from its end: an
    # older torch format with a small archive appended would pass here and be read by torch as the older format
    start = fh.read(4)
    end = zipfile._EndRecData(fh) if start == _LOCAL_MAGIC else None
    if end is None:
        raise bad("not a zip archive of torch.save; an older torch format is not read")
    if end[zipfile._ECD_ENTRIES_TOTAL] > MAX_ZIP_RECORDS or end[zipfile._ECD_SIZE] > MAX_ZIP_DIRECTORY:
        raise bad(f"a zip directory of {end[zipfile._ECD_ENTRIES_TOTAL]} records in {end[zipfile._ECD_SIZE]} "
                  f"bytes (at most {MAX_ZIP_RECORDS} in {MAX_ZIP_DIRECTORY})")
    total = fh.seek(0, os.SEEK_END)
    records = {}
    try:
        infos = zipfile.ZipFile(fh).infolist()  # every entry, a name given twice included
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:  # a directory that is not one zipfile reads
        raise bad(f"not a zip archive of torch.save ({reason(e)})") from None
    for info in infos:
        head = b""
        if info.header_offset >= 0:  # zipfile subtracts the bytes it takes to stand before the archive: may be < 0
            fh.seek(info.header_offset)
            head = fh.read(_LOCAL_HEADER)
        if len(head) < _LOCAL_HEADER or head[:4] != _LOCAL_MAGIC:
            raise bad(f"record {shown(info.filename)} has no local header")
        start = info.header_offset + _LOCAL_HEADER + sum(struct.unpack("<HH", head[26:30]))
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1 or info.compress_size != info.file_size \
                or start + info.file_size > total:
            raise bad(f"record {shown(info.filename)} is compressed, encrypted or past the file's end: torch.save "
                      "stores every record as it is")
        records[info.filename] = Record(start, info.file_size)
    return records
