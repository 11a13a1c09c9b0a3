"""The shared shape checks agree with a direct enumeration of valid layouts, and name the numbers involved."""

from __future__ import annotations

import pytest

from lcft.errors import LcftError
from lcft.shapes import check_batch, check_length, check_world


def _splits(length: int, cp: int, block: int) -> bool:
    """Oracle: 2*cp chunks of equal length, each of whole blocks (cp=1: whole blocks, no chunking)."""
    if length <= 0:
        return False
    if cp == 1:
        return length % block == 0
    chunk, rest = divmod(length, 2 * cp)
    return rest == 0 and chunk % block == 0


@pytest.mark.parametrize("cp,block", [(1, 1), (1, 16), (2, 16), (4, 8), (3, 4)])
def test_check_length_matches_the_enumeration(cp, block):
    for length in range(0, 300):
        ok = _splits(length, cp, block)
        if ok:
            check_length(length, cp, block)
        else:
            with pytest.raises(LcftError, match=f"{length} is not a multiple"):
                check_length(length, cp, block)


def test_check_length_window_and_names():
    with pytest.raises(LcftError, match=r"--seq-len 4096 is longer than the data's windows \(2048 tokens\)"):
        check_length(4096, what="--seq-len", window=2048)
    with pytest.raises(LcftError, match="--max-context 100 is not a multiple of the attention block size 64 of ck"):
        check_length(100, block=64, what="--max-context", source="ck")


def test_batch_and_world():
    for g in range(1, 40):
        for m in (1, 2, 3):
            for dp in (1, 2, 4):
                if g % (m * dp) == 0:
                    assert check_batch(g, m, dp) * m * dp == g
                else:
                    with pytest.raises(LcftError, match=rf"global_batch {g} is not a multiple of micro_batch .*\({m} x {dp}\)"):
                        check_batch(g, m, dp)
                    # the batches it names: the multiples of m x dp nearest to g, below (if any) and above
                    with pytest.raises(LcftError) as e:
                        check_batch(g, m, dp)
                    named = [int(n) for n in str(e.value).split(": ")[-1].removesuffix(" would split").split(" or ")]
                    multiples = [n for n in range(1, 2 * g + 2 * m * dp) if n % (m * dp) == 0]
                    assert named == [n for n in multiples if n < g][-1:] + [n for n in multiples if n > g][:1]
    assert check_world(8, 4) == 2 and check_world(3, 1) == 3
    with pytest.raises(LcftError, match=r"world size 6 is not divisible by cp=4 \(6 processes cannot .*groups of 4"):
        check_world(6, 4)
    with pytest.raises(LcftError, match=r"world size 1 is not divisible by cp=2 \(1 process cannot be split into "
                                        r"context-parallel groups of 2\): launch a multiple of 2 processes"):
        check_world(1, 2)
    with pytest.raises(LcftError, match="cp must be at least 1"):
        check_world(2, 0)
