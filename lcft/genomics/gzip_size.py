"""The least a plain gzip file can decompress to, told without decompressing it: the room to ask for first."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from lcft.genomics.fasta_check import isize

WRAP = 1 << 32  # gzip's ISIZE is a member's size mod 2^32
MAGIC = b"\x1f\x8b\x08"  # a member's first bytes: ID1, ID2, CM = deflate
MAX_HEADER_TEXT = 1 << 16  # a member's file name or comment read at most: a longer one leaves the floor at ISIZE
SCAN_CHUNK = 1 << 24  # bytes searched at a time for a further member
MAX_CANDIDATES = 10_000  # magic bytes inside the compressed data inflated from: more leave the floor at ISIZE
PROBE_BYTES = 1 << 14  # of compressed data after such a header: deflate data at random fails within it


def most_deflated(n: int) -> int:
    """The most bytes a deflate stream of `n` bytes takes: zlib's conservative deflateBound of 1.2.11 (n + n/8 +
    n/64 + 5, rounded up), above 1.3's for fixed-Huffman blocks of 9-bit literals (13%) and for stored blocks of 127
    bytes (4%, memLevel 1), plus 2 for the latter's larger constant: stored blocks of 65535 bytes (5 bytes of
    framing each) are not the most, zlib's own blocks are shorter. Any zlib level, memLevel, window and strategy
    stays under it on data that does not compress (tests/genomics/test_fasta_gzip_size.py), and DNA compresses; a
    writer that flushes every few bytes does not (each flush an empty block of 5 bytes)."""
    return n + (n + 7) // 8 + (n + 63) // 64 + 7


def least_input(deflated: int) -> int:
    """The fewest bytes a deflate stream of `deflated` bytes can hold: the smallest n whose `most_deflated` reaches
    it (bisection: most_deflated only grows with n)."""
    lo, hi = 0, max(deflated, 0)  # most_deflated(hi) > hi >= deflated
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if most_deflated(mid) < deflated else (lo, mid)
    return lo


def size_floor(size_mod: int, deflated: int) -> int:
    """The least a one-member gzip whose ISIZE is `size_mod` and whose deflate data is `deflated` bytes decompresses
    to. Its size n is size_mod plus some multiple of 2^32 (ISIZE is n mod 2^32) and at least `least_input(deflated)`
    (an encoder writes no more than `most_deflated(n)`): the smallest n that is both. ISIZE alone reads 4 GiB low
    for each 4 GiB past the first; the deflate data's length shows where ISIZE cannot be the whole size."""
    least = least_input(deflated)
    return size_mod if least <= size_mod else size_mod + -(-(least - size_mod) // WRAP) * WRAP


def header_end(fd: int, at: int) -> int | None:
    """Where the deflate data of a gzip member whose header starts at byte `at` begins: None where no member header
    starts there, -1 where one does whose file name or comment runs past MAX_HEADER_TEXT (its end unread). The
    fields as Python's gzip reads them (RFC 1952, its reserved flags not checked): FEXTRA (a 2-byte length), FNAME
    and FCOMMENT (zero-ended), FHCRC (2 bytes)."""
    head = os.pread(fd, 12, at)
    if len(head) < 10 or head[:3] != MAGIC:
        return None
    flags, end = head[3], at + 10
    if flags & 4:
        if len(head) < 12:
            return None
        end += 2 + int.from_bytes(head[10:12], "little")
    for bit in (8, 16):
        if flags & bit:
            zero = os.pread(fd, MAX_HEADER_TEXT, end).find(0)
            if zero < 0:
                return -1
            end += zero + 1
    return end + (2 if flags & 2 else 0)


def _starts_member(fd: int, at: int) -> bool:
    """Whether a gzip member may start at byte `at`: a header there, then deflate data that inflates without error
    for PROBE_BYTES (or to its end), or a header too long to read to its end. Magic bytes met inside compressed data
    fail (a block type of 3, a stored length not matching its complement, a code table that is not one, a distance
    before the start) long before."""
    body = header_end(fd, at)
    if body is None:
        return False
    if body < 0:  # taken for a member: the floor stays at ISIZE
        return True
    try:
        zlib.decompressobj(-zlib.MAX_WBITS).decompress(os.pread(fd, PROBE_BYTES, body), PROBE_BYTES * 64)
    except zlib.error:
        return False
    return True


def _another_member(fd: int, start: int, end: int) -> bool:
    """Whether a second member may start between `start` and `end` (or more candidates than MAX_CANDIDATES were
    met: then it may too). One read of the compressed data, in SCAN_CHUNK pieces, each read with the
    magic's length less one past it."""
    candidates, at = 0, start
    while at < end:
        span = min(SCAN_CHUNK, end - at)  # the hits starting in it are this piece's; the next finds those after
        chunk = os.pread(fd, span + len(MAGIC) - 1, at)
        hit = chunk.find(MAGIC)
        while 0 <= hit < span:
            candidates += 1
            if candidates > MAX_CANDIDATES or _starts_member(fd, at + hit):
                return True
            hit = chunk.find(MAGIC, hit + 1)
        at += SCAN_CHUNK
    return False


def gzip_size_floor(path: Path) -> int:
    """At least the bytes the whole gzip file `path` decompresses to. Its last 4 bytes are the ISIZE of its last
    member, that member's size mod 2^32: a floor for any file (zero padding after it only reads lower). Where the file
    is one member, not padded, and its deflate data is too long for a member of ISIZE bytes, the floor is lifted past
    4 GiB to `size_floor`; this is what needs a read of the whole compressed file (a search for a second member,
    whose own ISIZE the last one's would not add up with), and only then. A file cut short ends in compressed bytes
    instead: any figure under 4 GiB past the least its deflate data can hold."""
    with open(path, "rb") as fh:
        fd, size = fh.fileno(), os.fstat(fh.fileno()).st_size
        if size < 4:
            return 0
        low, body = isize(fd, size), header_end(fd, 0)
        if body is None or body < 0 or body + 8 > size:
            return low
        lifted = size_floor(low, size - 8 - body)
        # zero padding (which gzip readers skip) makes the last byte 0; so does an ISIZE under 16 MiB, not lifted
        if lifted == low or os.pread(fd, 1, size - 1) == b"\0" or _another_member(fd, body, size - 8):
            return low
        return lifted
