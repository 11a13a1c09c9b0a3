"""The DNA vocabulary's byte lookup tables (vectorised): bytes -> uint8 token ids, and back."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# The vocabulary lives below every layer (the model reads its defaults too); re-exported here for genomics.
from lcft.vocab import (  # noqa: F401
    BASES,
    BOS,
    EOS,
    NAME,
    PAD,
    SPECIALS,
    UNK,
    VOCAB,
    VOCAB_SIZE,
    A,
    C,
    G,
    N,
    T,
    tokenizer_spec,
)

IUPAC_AMBIGUOUS = "RYSWKMBDHVU"  # everything here becomes N (U too: DNA alphabet only)


def _build_lut() -> np.ndarray:
    lut = np.full(256, UNK, dtype=np.uint8)
    for ch, tok in zip(BASES, (A, C, G, T, N), strict=True):
        lut[ord(ch)] = tok
        lut[ord(ch.lower())] = tok
    for ch in IUPAC_AMBIGUOUS:
        lut[ord(ch)] = N
        lut[ord(ch.lower())] = N
    return lut


ENCODE_LUT = _build_lut()
DECODE_LUT = np.frombuffer(b"????ACGTN" + b"?" * (256 - 9), dtype=np.uint8).copy()


def encode(seq: bytes | bytearray | memoryview | np.ndarray | str) -> np.ndarray:
    """Encode sequence bytes to uint8 token ids (case-free; IUPAC codes -> N; anything else -> <unk>)."""
    if isinstance(seq, str):
        seq = seq.encode("ascii")
    raw = seq if isinstance(seq, np.ndarray) else np.frombuffer(seq, dtype=np.uint8)
    return ENCODE_LUT[raw]


def softmask_bits(seq: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """True where the byte is a lower-case ASCII letter (a soft-masked repeat)."""
    raw = seq if isinstance(seq, np.ndarray) else np.frombuffer(seq, dtype=np.uint8)
    return raw >= ord("a")


def decode(ids: np.ndarray, softmask: np.ndarray | None = None) -> str:
    """Token ids -> sequence string, upper case, lower case where `softmask` is True."""
    out = DECODE_LUT[np.asarray(ids, dtype=np.uint8)]
    if softmask is not None:
        out = np.where(np.asarray(softmask, dtype=bool), out | 0x20, out)  # ASCII lower-case bit
    return out.tobytes().decode("ascii")


# Streaming form of the same LUT: one bytes.translate pass per file chunk maps every byte to
# "token id | flags" and drops line breaks (several times faster than numpy fancy indexing plus a
# newline filter). The id sits in the low 4 bits; the flags let window statistics run as bit tests.
ID_BITS = 0x0F
FLAG_GC = 0x10  # C or G
FLAG_NOT_ACGT = 0x20  # N, IUPAC ambiguity codes, anything unknown
FLAG_LOWER = 0x80  # soft-masked (lower case), same rule as softmask_bits
LINE_BREAKS = b"\r\n"


def _build_flag_table() -> bytes:
    out = bytearray(ENCODE_LUT.tobytes())
    for b in range(256):
        tok = ENCODE_LUT[b]
        out[b] |= (FLAG_GC if tok in (C, G) else 0) | (0 if A <= tok <= T else FLAG_NOT_ACGT)
        out[b] |= FLAG_LOWER if b >= ord("a") else 0
    return bytes(out)


FLAG_TABLE = _build_flag_table()


def encode_lines(raw: bytes | bytearray, table: bytes = FLAG_TABLE) -> np.ndarray:
    """FASTA sequence bytes (line breaks allowed, dropped) -> uint8 array of `id | flags` (see FLAG_*):
    `out & ID_BITS` equals `encode`, `(out & FLAG_LOWER) != 0` equals `softmask_bits`. Another `table`
    maps the bytes through it instead (the identity keeps them as stored)."""
    return np.frombuffer(raw.translate(table, LINE_BREAKS), dtype=np.uint8)


LF, CR = ord("\n"), ord("\r")


def encode_pieces(
    pieces: Iterable[tuple[bytes | bytearray, int]], bases_per_line: int, out: np.ndarray, table: bytes = FLAG_TABLE
) -> int:
    """Fill `out` with `id | flags` codes from (data, rows) pieces of FastaFile.line_pieces; return the
    number of bases written. Whole-line pieces are translated without deletion (about half the cost of
    translate with a delete set) and their line breaks dropped by position in one strided copy; the
    fragments at the ends drop them by value. Raises ValueError when a line does not end where the
    index says (the file changed after indexing). `table` as in `encode_lines`."""
    p = 0
    for data, rows in pieces:
        if rows:
            width = len(data) // rows
            # the first and last line of the piece must end where the index says (pyfaidx checked every
            # line when it indexed; this catches a file changed since then at O(1) cost)
            if data[width - 1] != LF or data[-1] != LF or data[bases_per_line] not in (LF, CR):
                raise ValueError("line breaks are not where the FASTA index puts them")
            coded = np.frombuffer(data.translate(table), dtype=np.uint8).reshape(rows, -1)
            n = rows * bases_per_line
            out[p : p + n].reshape(rows, bases_per_line)[:] = coded[:, :bases_per_line]
        else:
            coded = encode_lines(data, table)
            n = coded.size
            out[p : p + n] = coded
        p += n
    return p
