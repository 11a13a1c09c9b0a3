"""The cause a diagnosis quotes from a failed collective: one printable line without gloo's source location (the
end-to-end diagnosis, with a frozen and a killed rank, is in tests/train/test_elastic.py and test_two_nodes.py)."""

from __future__ import annotations

from lcft.liveness import cause

GLOO = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:41024: Connection reset by peer"


def test_gloo_source_location_is_dropped():
    assert cause(RuntimeError(GLOO)) == "Read error [127.0.0.1]:41024: Connection reset by peer"


def test_every_line_is_kept_on_one_printable_bounded_line():
    said = cause(RuntimeError(GLOO + "\nException raised from recvFromPeer at pair.cc:1\n\x1b[2J" + "x" * 500))
    assert "\n" not in said and said.isprintable() and len(said) <= 200
    assert said.startswith("Read error") and "Exception raised from recvFromPeer" in said and "\\x1b" in said


def test_an_error_that_says_nothing_is_named_by_its_type():
    assert cause(TimeoutError()) == "TimeoutError"
