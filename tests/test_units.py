"""Counts in messages: singular for one, plural otherwise, thousands separated."""

from lcft.units import counted


def test_one_is_singular_and_every_other_count_plural():
    assert counted(1, "window") == "1 window"
    assert [counted(n, "eval window") for n in (0, 2, 2048)] == ["0 eval windows", "2 eval windows",
                                                                  "2,048 eval windows"]
    assert (counted(1, "entry", "entries"), counted(3, "entry", "entries")) == ("1 entry", "3 entries")
