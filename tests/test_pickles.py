"""The restricted unpickler every pickle we are handed goes through (lcft.pickles): what it admits is exactly
what its caller resolves, a persistent id is refused unless a caller reads them, and a memo index a pickle names
allocates nothing (the C unpickler sizes an array by it). Through DCP's `.metadata` reader, its first user."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import Metadata

from lcft.checkpoint.dcp_metadata import read_metadata_file
from lcft.errors import LcftError
from lcft.pickles import RestrictedUnpickler

REPO = Path(__file__).resolve().parents[1]


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


PEAK = textwrap.dedent("""
    import io, pickle, resource, sys
    from lcft.checkpoint.dcp_metadata import read_metadata_file
    from lcft.errors import LcftError
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.argv[2] == "lcft":
        try:
            read_metadata_file(sys.argv[1])
        except LcftError as e:
            print("LcftError", e)
    else:
        print("C unpickler", pickle.Unpickler(open(sys.argv[1], "rb")).load())
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, "MiB")
""")


def peak(path: Path, reader: str) -> tuple[str, int]:
    proc = subprocess.run([sys.executable, "-c", PEAK, str(path), reader], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0], int(lines[-1].split()[0])


def test_a_memo_index_allocates_nothing(tmp_path):
    path = tmp_path / ".metadata"
    path.write_bytes(memo_put(10**8))
    first, mib = peak(path, "C")  # the oracle this guards against: pickle.Unpickler allocates for the index
    assert first == "C unpickler None" and mib > 256, (first, mib)  # 0.6-1.5 GiB, as the kernel maps it
    first, mib = peak(path, "lcft")
    assert first.startswith("LcftError") and str(path) in first and "not" in first, first
    assert mib < 64, (first, mib)


def test_a_declared_length_past_the_file_is_one_line(tmp_path):
    path = tmp_path / ".metadata"
    path.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"ab")  # BINBYTES8 of 2**62 bytes
    with pytest.raises(LcftError) as e:
        read_metadata_file(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
