"""lcft.torch_zip on an archive that is a span of a larger file (an item of a DCP shard file): every record placed
within the span, read back as zipfile reads it from the archive alone; a deflated record or a span that is not the
archive is refused."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from lcft.torch_zip import stored_records


def _saved(tensor: torch.Tensor) -> bytes:
    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getvalue()


def _deflated(archive: bytes) -> bytes:
    """The archive with every record deflated."""
    src, out = zipfile.ZipFile(io.BytesIO(archive)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info))
    return out.getvalue()


def test_records_of_an_archive_inside_a_larger_file(tmp_path: Path) -> None:
    first, second = _saved(torch.arange(10.0)), _saved(torch.ones(3, 5))
    path = tmp_path / "shard"
    path.write_bytes(first + second + b"tail")
    with open(path, "rb") as fh:
        for start, archive in ((0, first), (len(first), second)):
            records = stored_records(fh, ValueError, span=(start, len(archive)))
            want = zipfile.ZipFile(io.BytesIO(archive))  # the oracle: zipfile on the archive alone
            assert sorted(records) == sorted(want.namelist())
            for name, (at, size) in records.items():
                fh.seek(start + at)
                assert fh.read(size) == want.read(name), name


@pytest.mark.parametrize("span, says", [("deflated", "is compressed"), ("cut", "not a zip archive"),
                                        ("short", "not a zip archive")])
def test_a_span_that_is_not_a_stored_archive_is_refused(tmp_path: Path, span: str, says: str) -> None:
    archive = _saved(torch.arange(10.0))
    body = _deflated(archive) if span == "deflated" else archive
    path = tmp_path / "shard"
    path.write_bytes(b"head" + body + archive)
    size = {"deflated": len(body), "cut": len(body) - 1, "short": 10}[span]
    with open(path, "rb") as fh, pytest.raises(ValueError, match=says):
        stored_records(fh, ValueError, span=(4, size))


def test_an_older_torch_format_with_an_archive_appended_is_refused(tmp_path: Path) -> None:
    """torch.load reads a file by its first bytes (here the legacy pickle format), zipfile by its end: a legacy
    file with a small stored archive after it passed the check, and torch then read the legacy format unchecked."""
    legacy = io.BytesIO()
    torch.save(torch.arange(4.0), legacy, _use_new_zipfile_serialization=False)
    path = tmp_path / "state.pt"
    path.write_bytes(legacy.getvalue() + _saved(torch.ones(2)))
    assert torch.equal(torch.load(path, weights_only=True), torch.arange(4.0))  # torch takes it for the legacy file
    with open(path, "rb") as fh, pytest.raises(ValueError, match="not a zip archive of torch.save"):
        stored_records(fh, ValueError)


def test_a_damaged_directory_or_a_span_past_the_end_is_refused(tmp_path: Path) -> None:
    """A central directory entry whose signature is damaged (zipfile's BadZipFile escaped as a traceback), and a
    span that runs past the file's end (its archive found in bytes beyond the item)."""
    archive = _saved(torch.arange(10.0))
    path = tmp_path / "state.pt"
    at = archive.index(b"PK\x01\x02")
    path.write_bytes(archive[:at] + b"XX" + archive[at + 2:])
    with pytest.raises(zipfile.BadZipFile):  # the oracle: zipfile itself
        zipfile.ZipFile(path)
    with open(path, "rb") as fh, pytest.raises(ValueError, match="not a zip archive of torch.save"):
        stored_records(fh, ValueError)
    path.write_bytes(archive)
    with open(path, "rb") as fh, pytest.raises(ValueError, match="run past the file's end"):
        stored_records(fh, ValueError, span=(0, len(archive) + 1))
