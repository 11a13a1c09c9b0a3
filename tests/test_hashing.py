"""lcft.hashing: chunked hashes equal hashlib's, and a folder's digest is its files' names and digests in order."""

from __future__ import annotations

import hashlib
import os

import pytest

import lcft.hashing as hashing
from lcft.hashing import file_hash, files_sha256


@pytest.mark.parametrize("algorithm", ["sha256", "md5"])
def test_file_hash_matches_hashlib_across_chunks(tmp_path, monkeypatch, algorithm):
    data = os.urandom(1000)
    p = tmp_path / "d"
    p.write_bytes(data)
    monkeypatch.setattr(hashing, "HASH_CHUNK", 7)  # many reads, the last one short
    assert file_hash(p, algorithm).hexdigest() == hashlib.new(algorithm, data).hexdigest()
    assert file_hash(p, algorithm, upto=333).hexdigest() == hashlib.new(algorithm, data[:333]).hexdigest()
    assert file_hash(p, algorithm, upto=0).hexdigest() == hashlib.new(algorithm).hexdigest()


def test_files_sha256_is_the_name_ordered_digest_of_names_and_file_hashes(tmp_path):
    a, b = tmp_path / "b.bin", tmp_path / "a.bin"
    a.write_bytes(b"second"), b.write_bytes(b"first")
    want = hashlib.sha256()
    for f in (b, a):  # name order: a.bin, b.bin
        want.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).hexdigest().encode())
    assert files_sha256([a, b]) == want.hexdigest()
