"""How a value read from a file is shown in a one-line error (lcft.errors.shown): plain data as Python writes it,
bounded in depth, items and length whatever the file built; anything else by its type name. And what a library's
exception says about a file (lcft.errors.reason): one line, nothing unprintable, bounded."""

from __future__ import annotations

import sys
import tracemalloc

import pytest

from lcft.errors import is_oom, reason, shown


def deep(levels: int) -> list:
    x: list = []
    for _ in range(levels):
        x = [x]
    return x


def shared(levels: int) -> list:
    x: list = []
    for _ in range(levels):
        x = [x, x]
    return x


class Loud:
    def __repr__(self) -> str:  # what a crafted object's own repr could do
        raise AssertionError("its own repr was asked for")


@pytest.mark.parametrize("value", [10**5000, deep(200_000), shared(24), "x" * 10**7, b"\0" * 10**7, Loud(),
                                   {"k": [Loud()] * 10**6}], ids=["int", "deep", "shared", "str", "bytes", "obj",
                                                                  "dict"])
def test_anything_a_file_builds_is_shown_short_and_fast(value):
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    tracemalloc.start()
    sys.setprofile(count)
    try:
        text = shown(value)
    finally:
        sys.setprofile(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert len(text) <= 80 and "\n" not in text, text
    # a bound on the work, counted rather than timed: a plain repr of shared(24) builds ~100 MB, of the str and bytes
    # 10-40 MB, of deep() it recurses past Python's limit, and a walk of every path through shared(24) makes ~2**24 calls
    assert calls < 5_000 and peak < 1 << 20, (calls, peak)


def test_plain_data_reads_as_python_writes_it():
    assert shown("chr1") == "chr1" and shown("chr1", quoted=True) == "'chr1'" and shown("a\nb") == "'a\\nb'"
    assert shown((2.5, None, True, b"x")) == "(2.5, None, True, b'x')" == repr((2.5, None, True, b"x"))
    assert shown({"k": [1, 2]}) == "{'k': [1, 2]}"
    assert shown(list(range(10))) == "[0, 1, 2, 3, ...]"
    assert shown(10**5000) == "<int of 16610 bits>" and shown(Loud()) == "<Loud>"
    assert "..." in shown("y" * 200) and len(shown("y" * 200)) <= 80


@pytest.mark.parametrize("error, said", [
    (ValueError('Duplicate key "a\x1b[2J"'), 'Duplicate key "a\\x1b[2J"'),  # a terminal escape, escaped
    (RuntimeError("404 Client Error.\n\nRepository Not Found for url: x"),
     "404 Client Error. Repository Not Found for url: x"),  # every line kept, joined
    (KeyError("model.\nx"), "'model.\\nx'"),  # KeyError says its key's repr
    (ValueError("tab\there, é"), "tab\\there, é"),
    (ValueError(""), "ValueError"),
    (OSError(), "OSError"),
], ids=["escape", "lines", "key", "tab", "empty", "bare"])
def test_a_librarys_message_is_one_printable_line(error, said):
    assert reason(error) == said


def test_a_librarys_message_is_bounded():
    said = reason(ValueError("x" * 10_000 + "\n" + "y"), limit=50)
    assert len(said) == 50 and said.endswith("...") and said.isprintable()


def test_is_oom():
    import torch

    assert is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory"))
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))
