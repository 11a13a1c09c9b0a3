"""The least a plain gzip FASTA decompresses to, checked before decompressing it: the size model against zlib itself,
the floor against a brute-force search of the sizes its trailer allows, and real files (one member past 4 GiB, a
second member, zero padding) against what Python's gzip reads from them."""

from __future__ import annotations

import gzip
import itertools
import random
import struct
import zlib
from pathlib import Path

import pytest

from lcft.errors import LcftError
from lcft.genomics.fasta_cache import check_room_to_decompress
from lcft.genomics.gzip_size import WRAP, gzip_size_floor, least_input, most_deflated, size_floor
from tests.genomics.test_fasta_cache_space import _with_free

STRATEGIES = (zlib.Z_DEFAULT_STRATEGY, zlib.Z_FILTERED, zlib.Z_HUFFMAN_ONLY, zlib.Z_RLE, zlib.Z_FIXED)
# Strategies whose deflate reads no level past "0: stored blocks" (zlib's deflate_huff and deflate_rle): levels 2 to 9
# write level 1's bytes (test_levels_past_1_write_level_1s_bytes_under_huffman_only_and_rle), so the largest size
# runs level 1 alone under them, its seconds going to the strategies whose level chooses the matching
LEVEL_FREE = (zlib.Z_HUFFMAN_ONLY, zlib.Z_RLE)


def _deflated(data: bytes, level: int, mem: int, strategy: int, wbits: int) -> int:
    c = zlib.compressobj(level, zlib.DEFLATED, wbits, mem, strategy)
    return len(c.compress(data) + c.flush())


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16_383, 70_000])
def test_zlib_never_deflates_past_most_deflated(n):
    """Data that does not compress, and bytes past 143 (9 bits each in a fixed-Huffman block), under every zlib
    level, memLevel, strategy and two windows: the raw deflate stream is at most `most_deflated(n)` bytes."""
    for data in _incompressible(n):
        for level, mem, strategy, wbits in itertools.product(range(10), range(1, 10), STRATEGIES, (-15, -9)):
            if n > 16_383 and strategy in LEVEL_FREE and level > 1:
                continue
            got = _deflated(data, level, mem, strategy, wbits)
            assert got <= most_deflated(n), (n, level, mem, strategy, wbits, got)


def _incompressible(n: int) -> tuple[bytes, bytes]:
    """`n` random bytes, and `n` random bytes past 143 (9 bits each in a fixed-Huffman block)."""
    rng = random.Random(n)
    return rng.randbytes(n), bytes(rng.randrange(144, 256) for _ in range(n))


def test_levels_past_1_write_level_1s_bytes_under_huffman_only_and_rle():
    """Under every memLevel and both windows, at 16,383 bytes (several blocks at every memLevel but 9)."""
    for data in _incompressible(16_383):
        for mem, strategy, wbits in itertools.product(range(1, 10), LEVEL_FREE, (-15, -9)):
            first = zlib.compressobj(1, zlib.DEFLATED, wbits, mem, strategy)
            want = first.compress(data) + first.flush()
            for level in range(2, 10):
                c = zlib.compressobj(level, zlib.DEFLATED, wbits, mem, strategy)
                assert c.compress(data) + c.flush() == want, (level, mem, strategy, wbits)


def test_least_input_is_the_fewest_bytes_that_can_deflate_that_long():
    for deflated in range(2000):
        assert least_input(deflated) == next(n for n in itertools.count() if most_deflated(n) >= deflated), deflated
    for deflated in (10**6, 2**32 + 7, 3 * 10**10):  # past what a search from 0 reaches: the least, by monotony
        n = least_input(deflated)
        assert most_deflated(n) >= deflated > most_deflated(n - 1), deflated


def _brute_floor(size_mod: int, deflated: int) -> int:
    """The sizes the trailer allows, smallest first, until one can deflate to `deflated` bytes."""
    return next(n for n in (size_mod + k * WRAP for k in itertools.count()) if most_deflated(n) >= deflated)


def test_size_floor_is_the_smallest_size_both_allow():
    rng = random.Random(7)
    pairs = [(0, 0), (0, 8), (5, 0), (WRAP - 1, 3 * WRAP), (1, 2**40), (2**24, 2**26)]
    pairs += [(s, most_deflated(s) + d) for s in (0, 1, 2**24, WRAP - 1) for d in (-1, 0, 1)]
    pairs += [(rng.randrange(WRAP), rng.randrange(2**36)) for _ in range(2000)]
    pairs += [(rng.randrange(2**20), rng.randrange(2**26)) for _ in range(2000)]
    for size_mod, deflated in pairs:
        assert size_floor(size_mod, deflated) == _brute_floor(size_mod, deflated), (size_mod, deflated)


def test_a_one_member_gzip_under_4_gib_floors_at_its_size(tmp_path):
    """Text, data that does not compress, and fixed-Huffman blocks of 9-bit literals (the most zlib expands): the
    floor is the size Python's gzip reads back, never lifted past it."""
    rng = random.Random(3)
    text = b">chr1\n" + b"ACGTTGCAAN\n" * 100_000
    noise = rng.randbytes(1 << 20)
    high = bytes(rng.randrange(144, 256) for _ in range(1 << 18))
    fixed = zlib.compressobj(9, zlib.DEFLATED, 31, 9, zlib.Z_FIXED)
    files = {"text": gzip.compress(text, mtime=0), "noise": gzip.compress(noise, 9, mtime=0),
             "fixed": fixed.compress(high) + fixed.flush()}
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
        assert gzip_size_floor(tmp_path / name) == len(gzip.decompress(body)), name


def _member(data: bytes, flags: int = 0, name: bytes = b"") -> bytes:
    """A gzip member of `data`, its header's flags and file name (FNAME, 8) as given."""
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    head = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\x02\xff" + (name + b"\0" if flags & 8 else b"")
    return head + c.compress(data) + c.flush() + struct.pack("<II", zlib.crc32(data), len(data) % WRAP)


@pytest.mark.parametrize(("pad", "flags", "name"), [
    (0, 0, b""), (2, 0, b""),
    (0, 0xE0, b""),  # reserved flags, which Python's gzip does not check
    (0, 8, b"x" * 70_000),  # a file name longer than is read
])
def test_a_second_member_or_padding_is_never_lifted(tmp_path, pad, flags, name):
    """20 MiB that do not compress, then a member of 16 MiB of zeros (its ISIZE 0x01000000: a last byte not 0):
    deflate data too long for one member of the last ISIZE, which a lift would read as 4 GiB more; the floor stays
    what the last 4 bytes say (padded: less), below the size Python's gzip reads."""
    path = tmp_path / "two.gz"
    body = _member(random.Random(5).randbytes(20 << 20)) + _member(bytes(1 << 24), flags, name) + bytes(pad)
    path.write_bytes(body)
    with gzip.open(path) as fh:
        assert sum(len(b) for b in iter(lambda: fh.read(1 << 22), b"")) == 36 << 20
    assert size_floor(1 << 24, len(body) - pad - 18) > WRAP
    assert gzip_size_floor(path) == struct.unpack("<I", body[-4:])[0] == (256 if pad else 1 << 24)


@pytest.mark.parametrize("pad", [1, 3, 4, 1000])
def test_one_member_padded_with_zeros_is_not_lifted(tmp_path, pad):
    body = gzip.compress(random.Random(pad).randbytes(1 << 20), 9, mtime=0)
    (tmp_path / "padded.gz").write_bytes(body + bytes(pad))
    floor = gzip_size_floor(tmp_path / "padded.gz")
    assert floor == struct.unpack("<I", (body + bytes(pad))[-4:])[0] and floor <= 1 << 20


@pytest.fixture(scope="module")
def past_4_gib(tmp_path_factory) -> tuple[Path, int]:
    """One gzip member of 4 GiB of zeros, then 16 MiB that do not compress (21 MB on disk), made from one deflated
    16 MiB piece repeated (a full flush ends each: no piece refers to the one before); the size Python's gzip reads
    from it, CRC and ISIZE checked."""
    path, zeros = tmp_path_factory.mktemp("big") / "big.gz", bytes(1 << 24)
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    piece = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) == piece  # the state a full flush leaves is the same
    noise = random.Random(11).randbytes(1 << 24)
    crc = 0
    with open(path, "wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
        for _ in range(256):
            fh.write(piece)
            crc = zlib.crc32(zeros, crc)
        fh.write(c.compress(noise) + c.flush())
        fh.write(struct.pack("<II", zlib.crc32(noise, crc), (WRAP + (1 << 24)) % WRAP))
    with gzip.open(path) as fh:
        return path, sum(len(b) for b in iter(lambda: fh.read(1 << 24), b""))


@pytest.mark.slow
def test_one_member_past_4_gib_floors_at_its_size(past_4_gib):
    """Its trailer says 16 MiB; its deflate data, 21 MB, cannot hold that little: the floor is the whole size."""
    path, size = past_4_gib
    assert size == WRAP + (1 << 24) and gzip_size_floor(path) == size


@pytest.mark.slow
def test_room_for_its_trailers_figure_is_refused_before_writing(past_4_gib, tmp_path, monkeypatch):
    """Free space one byte under the whole size: one line naming it (the trailer alone let the copy start)."""
    path, size = past_4_gib
    _with_free(monkeypatch, tmp_path, size - 1)
    with pytest.raises(LcftError, match=f"needs at least {size / 2**20:.1f} MiB, {(size - 1) / 2**20:.1f} MiB free"):
        check_room_to_decompress(path, tmp_path)
