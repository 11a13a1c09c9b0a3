"""The window reader's positioned reads: a part of a window reads as the files hold it, and a file cut short
under an open reader (a second `lcft prepare --overwrite`, a copy still being written) is a one-line error for
the windows it lost (a memory map stopped the process with SIGBUS, exit 135 and no message)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lcft.genomics import open_windows, prepare_windows, sample_fasta
from lcft.genomics.window_set import WindowSet
from tests.one_line import one_line

L = 1024


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("window_read")
    for spec in ("char", "kmer:2"):
        prepare_windows(fasta=str(sample_fasta()), out=str(d / spec.replace(":", "")), length=L, train="chr2",
                        eval="chr22", tokenizer=spec)
    return d


@pytest.mark.parametrize("kind", ["char", "kmer2"])
def test_a_part_of_a_window_reads_as_the_files_hold_it(prepared, kind):
    """Token ranges not on a byte of the soft mask's bits, empty, one token, whole: against the files read whole."""
    ws = open_windows(prepared / kind, "train")
    ids = np.fromfile(prepared / kind / "train.bin", dtype=ws.dtype).reshape(-1, L)  # (n, L)
    soft = np.unpackbits(np.fromfile(prepared / kind / "train.softmask.bin", dtype=np.uint8)).reshape(-1, L)  # (n, L)
    assert soft.any() and not soft.all()  # the sample is partly soft-masked: the bits are worth comparing
    last = len(ws) - 1
    for i, start, stop in [(0, 0, L), (3, 5, 1021), (last, 7, 8), (2, 8, 16), (1, 0, 0), (4, L - 3, L), (5, 9, 9)]:
        np.testing.assert_array_equal(ws.ids(i, start, stop), ids[i, start:stop])
        got = ws.softmask(i, start, stop)
        assert got.dtype == bool and got.shape == (stop - start,)
        np.testing.assert_array_equal(got, soft[i, start:stop].astype(bool))
    np.testing.assert_array_equal(ws[last], ids[last])
    for start, stop in [(0, L + 1), (5, 4), (-1, 3)]:  # a caller's bug, not the user's
        with pytest.raises(ValueError, match="not inside a window of 1024"):
            ws.ids(0, start, stop)


READS: dict[str, tuple[str, str, Callable[[WindowSet, int], object]]] = {
    "ids": ("char", "train.bin", lambda ws, i: ws[i]),
    "softmask": ("char", "train.softmask.bin", lambda ws, i: ws.softmask(i)),
    "bases": ("kmer2", "train.bases.bin", lambda ws, i: ws.token_bases(i)),
    "basemask": ("kmer2", "train.basemask.bin", lambda ws, i: ws.sequence(i)),
}


@pytest.mark.parametrize("case", list(READS))
def test_a_file_cut_short_after_opening_is_one_line(prepared, tmp_path, case):
    """Each file of a split cut to half under an open reader: a window it still holds reads as before, the last
    window is one line naming the file."""
    kind, name, read = READS[case]
    folder = tmp_path / kind
    shutil.copytree(prepared / kind, folder)
    ws = open_windows(folder, "train")
    first = read(ws, 0)
    size = (folder / name).stat().st_size
    os.truncate(folder / name, size // 2)
    np.testing.assert_array_equal(read(ws, 0), first)
    msg = one_line(lambda: read(ws, len(ws) - 1), f"{folder / name} changed since it was checked",
                   f"it had {size:,} bytes, now {size // 2:,} bytes", "lcft prepare verify")
    assert "Traceback" not in msg


def test_a_file_replaced_after_opening_still_reads_the_opened_one(prepared, tmp_path):
    """A new file renamed over the old one (how a copy tool or an editor replaces it): the reader keeps the file it
    checked, so a run sees one consistent set of windows."""
    folder = tmp_path / "char"
    shutil.copytree(prepared / "char", folder)
    ws = open_windows(folder, "train")
    want = np.fromfile(folder / "train.bin", dtype=np.uint8).reshape(-1, L)
    (folder / "new.bin").write_bytes(bytes(10))
    os.replace(folder / "new.bin", folder / "train.bin")
    np.testing.assert_array_equal(ws[len(ws) - 1], want[-1])
