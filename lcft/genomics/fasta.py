"""FASTA access through pyfaidx: input checks with one-line errors, the index opened (built again where it does not
fit the file), the file's digest; its records are read through FastaRecords (lcft.genomics.fasta_read)."""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyfaidx

from lcft.errors import LcftError, reason, shown
from lcft.genomics.fai_build import build_bgzf_index, build_fai
from lcft.genomics.fai_lines import LongHeader
from lcft.genomics.fasta_cache import (
    decompress_to_cache,
    discard_copies,
    index_paths,
    named_for_pyfaidx,
    normalize_to_cache,
)
from lcft.genomics.fasta_check import (
    NORMALIZED,
    fai_parses,
    gzi_fits,
    gzip_kind,
    indexing_error,
    joined_header,
    non_utf8_line,
    not_a_fasta_file,
    odd_sequence_line,
)
from lcft.genomics.fasta_read import BGZF_DAMAGE, GZIP_DAMAGE, FastaRecords
from lcft.genomics.fasta_scan import MAX_GAP, IndexScan, long_header, scan_index
from lcft.hashing import file_hash


def _first_text(path: Path, kind: str, n: int = 1 << 16, most: int = 1 << 24) -> bytes:
    """The file's first `n` bytes (decompressed), read on until they hold a line break (a header can be longer
    than `n`: what ends it decides how pyfaidx must be given the file), at most `most`."""
    try:
        with open(path, "rb") if kind == "plain" else gzip.open(path, "rb") as fh:
            parts = [fh.read(n)]
            while len(parts) * n < most and not re.search(rb"[\r\n]", parts[-1]) and (more := fh.read(n)):
                parts.append(more)
            return b"".join(parts)
    except (OSError, *GZIP_DAMAGE) as e:
        raise LcftError(f"{path}: not a readable FASTA ({reason(e)})") from None


def fasta_start(p: Path, kind: str) -> bytes:
    """The first bytes of FASTA `p` (decompressed: `kind` is gzip_kind's), refused in one line where they show it
    is none: no record, or a first line (past blank and ';' comment lines) that is no '>' header."""
    head = _first_text(p, kind)
    body = [ln.strip() for ln in head.splitlines()]
    body = [ln for ln in body if ln and not ln.startswith(b";")]
    if not body:
        raise LcftError(f"empty FASTA: {p} has no records")
    if not body[0].startswith(b">"):
        shown = body[0][:40].decode("ascii", "replace")
        raise LcftError(f"not a FASTA file: {p} (first line {shown!r} does not start with '>')")
    return head


def check_fasta(path: str | os.PathLike, sha256: Callable[[], str]) -> tuple[Path, Path, str]:
    """Validate a FASTA path before anything is written. Returns (given path, path pyfaidx reads, gzip kind).

    Plain gzip is decompressed into the cache (see `decompress_to_cache`); BGZF is read in place. sha256: the
    file's digest, asked for only when a copy in the cache is named by it."""
    p = Path(path)
    if not p.exists():
        raise LcftError(f"FASTA not found: {p} (`lcft prepare fetch hg38 --out DIR` downloads the human reference "
                        "as DIR/hg38.fa)")
    if (why := not_a_fasta_file(p)) is not None:
        raise why
    if p.stat().st_size == 0:
        raise LcftError(f"empty FASTA: {p} has no bytes")
    kind = gzip_kind(p)
    head = fasta_start(p, kind)
    if re.search(rb"\r(?!\n)", head.rstrip(b"\r")):  # CR-only line ends: pyfaidx would see one line
        return p, normalize_to_cache(p, kind, sha256()), kind
    readable = decompress_to_cache(p, sha256()) if kind == "gzip" else named_for_pyfaidx(p, kind)
    return p, readable, kind


def _not_a_file(path: Path) -> bool:
    """Something other than a regular file under an index's name (a FIFO would block pyfaidx's read forever, a
    link to /dev/zero fill memory): never read, built again."""
    return os.path.lexists(path) and not path.is_file()


class FastaFile(FastaRecords):
    """A FASTA opened through pyfaidx's index: names, lengths and raw (line-broken) byte ranges (FastaRecords)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._sha256: str | None = None
        self._hashing: Future[str] | None = None
        try:
            self._open()
        except LcftError:
            if self._sha256 is not None:  # the cache's copies of a refused file are named by it (none without it)
                discard_copies(self._sha256)
            raise

    def _open(self) -> None:
        """Check the file, open its index (from a copy in the cache where pyfaidx cannot read it as it is), and
        check the index against the file."""
        self.path, self.readable, self.kind = check_fasta(self.path, self.sha256)
        self.faidx = self._index_or_normalized()
        self._adopt()
        found = self._scan_reused()
        if found.mismatch and self._reused:  # an index newer than its FASTA that no longer describes it
            self.faidx.close()
            self.faidx = self._index_or_normalized(stale=True)
            self._adopt()
            found = scan_index(self)
        if found.blanks and not self.readable.name.endswith(NORMALIZED):  # pyfaidx counted the blanks as bases
            self.faidx.close()
            self.readable = normalize_to_cache(self.path, self.kind, self.sha256())
            try:
                self.faidx = self._index()
            except pyfaidx.FastaIndexingError:  # blanks ended some lines of a record, stood for bases in others
                raise LcftError(
                    f"{self.path}: its sequence lines are of unequal length once the spaces and tabs ending some "
                    f"of them (first in record {shown(found.blanks, quoted=True)}) are dropped, as Biopython drops "
                    "them; remove blanks from the sequence lines, e.g. `sed '/^>/!s/[[:blank:]]//g' in.fa > "
                    "out.fa`, and re-wrap them, e.g. `seqkit seq -w 60`") from None
            self._adopt()
            found = scan_index(self)
        if found.mismatch:  # pyfaidx's own index does not fit the file: it checks line lengths in bytes only
            if (name := long_header(self.index)) is not None:
                self.close()
                raise LcftError(f"{self.path}: the header line of record {shown(name, quoted=True)} is over "
                                f"{MAX_GAP >> 20} MiB long (not read); shorten it, e.g. `sed '/^>/s/ .*//'`")
            self.close()
            raise self._explained(LcftError(
                f"{self.path}: its records are not laid out as their first lines say ({found.mismatch}): a "
                "record's last line longer than its others does this, or a line with another line end (CRLF among "
                "LF) and a base less; re-wrap the file, e.g. `seqkit seq -w 60`"))
        if not self.index:
            self.close()
            raise LcftError(f"empty FASTA: {self.path} has no sequence records")

    def _index_or_normalized(self, stale: bool = False) -> pyfaidx.Faidx:
        """`_index`, or, where pyfaidx refuses the layout, that of a normalized copy: blank lines, which pyfaidx
        tolerates only in some places (not with CRLF line ends, not two after a record's full last line). If the
        copy is refused too, the original error (with the file's own line numbers) stands."""
        try:
            return self._index(stale)
        except pyfaidx.FastaIndexingError as e:
            if self.readable.name.endswith(NORMALIZED):
                raise self._explained(indexing_error(self.path, e)) from None
            self.readable = normalize_to_cache(self.path, self.kind, self.sha256())
            try:
                return self._index()
            except pyfaidx.FastaIndexingError:
                raise self._explained(indexing_error(self.path, e)) from None

    def _explained(self, refusal: LcftError) -> LcftError:
        """`refusal` of the file's layout, unless a letter of several bytes among the bases is its cause (pyfaidx
        counts it as one character, so no re-wrap would help), or a header joined to the line before it: then that,
        naming the line."""
        if (found := odd_sequence_line(self.path)) is None:
            return refusal
        line, byte = found
        if byte == b">":
            return joined_header(self.path, f"line {line}")
        return LcftError(f"{self.path}: line {line} holds a non-ASCII character among bases; a FASTA's sequence "
                         "lines are ASCII letters (IUPAC codes): fix or remove it")

    def _scan_reused(self) -> IndexScan:
        """scan_index of the index as opened: one reused from beside the file through which a read fails (a .gzi
        start inside a block, of a size the file can have) does not describe the file, which may be sound; a read
        that fails through a fresh index is the file's fault and stays an error."""
        try:
            return scan_index(self)
        except LcftError:
            if not self._reused:
                raise
            return IndexScan("a read through it fails", None)

    def _adopt(self) -> None:
        """Read what the open index says (again, after a rebuild)."""
        self.index = self.faidx.index
        self.indexname = Path(self.faidx.indexname)
        gzi = getattr(self.faidx, "gzi_index", None) or []
        self._gzi_ustarts = [b.ustart for b in gzi]

    def _index(self, stale: bool = False) -> pyfaidx.Faidx:
        """pyfaidx's index of the readable file; stale: the existing one is removed and built again. A gzip
        that only starts as BGZF is then read as a plain gzip is: from its decompressed copy."""
        read_kind = "bgzf" if self.readable.name.endswith((".gz", ".bgz")) else "plain"
        paths = index_paths(self.readable, read_kind, stale)
        fai = Path(paths.get("indexname", str(self.readable) + ".fai"))
        gzi = Path(paths.get("gzi_indexname", str(self.readable) + ".gzi"))
        if stale:
            for index in (fai, gzi):
                try:
                    index.unlink(missing_ok=True)
                except OSError as e:  # a folder under the index's name
                    raise LcftError(f"{index}: cannot replace this index of {self.path} ({e.strerror}); remove "
                                    "it") from None
        elif (_not_a_file(fai) or (fai.is_file() and not fai_parses(fai))
              or (read_kind == "bgzf" and (_not_a_file(gzi) or (gzi.is_file() and not gzi_fits(gzi, self.readable))))):
            return self._index(stale=True)  # an index that cannot describe the file: pyfaidx reads it as is
        self._reused = fai.is_file()  # pyfaidx keeps an index newer than the file without reading the file
        try:
            if not self._reused:  # pyfaidx's index and errors, its memory bounded (pyfaidx reads lines whole)
                build_fai(self.readable, fai) if read_kind == "plain" else build_bgzf_index(self.readable, fai, gzi)
            return pyfaidx.Faidx(str(self.readable), duplicate_action="stop", **paths)
        except LongHeader as e:
            raise LcftError(f"{self.path}: {e}") from None
        except pyfaidx.UnsupportedCompressionFormat as e:
            raise self._explained(indexing_error(self.path, e)) from None
        except ValueError as e:
            if "Duplicate key" in str(e):  # pyfaidx: 'Duplicate key "chr1"'
                raise LcftError(f"{self.path}: {reason(e)} (record names must be unique)") from None
            if "codec can't decode" in str(e) and (line := non_utf8_line(self.path)) is not None:
                raise LcftError(f"{self.path}: line {line} is not UTF-8 text ({reason(e)}); re-encode the file, e.g. "
                                "`iconv -f latin1 -t utf-8 in.fa > out.fa`") from None
            if read_kind != "bgzf":
                raise LcftError(f"{self.path}: pyfaidx cannot index this FASTA: {reason(e)}") from None
            # Bio.bgzf: a member that is not BGZF (`cat a.fa.bgz b.fa.gz`): gzip, read at random only once
            # decompressed, as Biopython reads it whole
            self.kind, self.readable = "gzip", decompress_to_cache(self.path, self.sha256())
            return self._index()
        except RuntimeError as e:  # pyfaidx: "Unhandled exception during fasta indexing" (odd line lengths)
            # pyfaidx's other refusal of a layout, judged alike by the caller (`_index_or_normalized`)
            raise pyfaidx.FastaIndexingError(str(e)) from None
        except OSError as e:
            raise LcftError(f"{self.path}: cannot index FASTA: {reason(e)}") from None
        except BGZF_DAMAGE as e:  # Bio.bgzf on a cut or damaged block
            raise LcftError(f"{self.path}: truncated or corrupt BGZF ({e or type(e).__name__})") from None

    def __enter__(self) -> FastaFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.faidx.close()

    def sha256(self) -> str:
        """sha256 of the FASTA file as given (compressed bytes for .gz): what its windows are cut from. Read
        once per open: it also names the copy in the cache that a plain gzip or a normalized file is read from,
        so the manifest's digest is the one of the bytes read."""
        if self._sha256 is None:
            try:
                self._sha256 = self._hashing.result() if self._hashing else file_hash(self.path).hexdigest()
            except OSError as e:  # (on a thread: gone or unreadable since it was opened)
                raise LcftError(f"{self.path}: cannot read it to hash it ({reason(e)})") from None
        return self._sha256

    def hash_in_background(self) -> None:
        """Start `sha256` on a thread, for a caller with other work to do before it needs the digest (reading the
        file and hashing it release the GIL)."""
        if self._sha256 is None and self._hashing is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="lcft-fasta-sha256")
            self._hashing = pool.submit(lambda: file_hash(self.path).hexdigest())
            pool.shutdown(wait=False)  # the thread ends with its one task


SAMPLE_NAME = "human_sample.fa.gz"


def sample_fasta() -> Path:
    """The bundled demo FASTA (BGZF; records chr2 = hg38 chr2:1-2,333,275 and chr22 = GRCh37
    chr22:20,000,001-21,000,000; see lcft/data/sample/README.md). Its .fai/.gzi ship beside it; when the
    package folder is read-only and they are stale, FastaFile puts fresh ones in the cache."""
    path = Path(__file__).resolve().parent.parent / "data" / "sample" / SAMPLE_NAME
    if not path.is_file():
        raise LcftError(f"bundled sample missing: {path} (broken install?)")
    return path
