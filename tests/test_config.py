"""The config plumbing: field docs, sizes, precedence, unknown keys, TOML round trip."""

from dataclasses import dataclass

import pytest

from lcft.config import ConfigError, build, doc, dumps_toml, format_size, merge, parse_size, tomllib


@dataclass
class _Cfg:
    length: int = 1024
    """Window length in tokens."""
    names: tuple[str, ...] = ("chr1", "chr2")
    """Chromosomes."""
    rate: float = 0.5
    """A rate."""
    flag: bool = False
    """A flag."""


def test_field_docs():
    assert doc(_Cfg, "length") == "Window length in tokens."
    assert doc(_Cfg, "names") == "Chromosomes."


@pytest.mark.parametrize("s,n", [("512K", 524288), ("1M", 1048576), ("1048576", 1048576), ("65536", 65536), (4096, 4096)])
def test_parse_size(s, n):
    assert parse_size(s) == n


@pytest.mark.parametrize("bad", ["", "abc", "1.5K7", "-3", "0"])
def test_parse_size_bad(bad):
    with pytest.raises(ConfigError):
        parse_size(bad)


def test_format_size_roundtrip():
    for n in (1024, 524288, 1048576, 1000):
        assert parse_size(format_size(n)) == n


def test_precedence_and_unknown_key():
    toml = {"length": "2K", "rate": 0.1}
    flags = {"length": None, "rate": 0.2, "names": "chrA,chrB"}
    cfg = build(_Cfg, merge(toml, flags))
    assert cfg.length == 2048 and cfg.rate == 0.2 and cfg.names == ("chrA", "chrB") and cfg.flag is False
    assert build(_Cfg, {"length": "0"}).length == 0  # plain integers, zero included, are not sizes
    with pytest.raises(ConfigError, match="'lenght'"):
        build(_Cfg, {"lenght": 3})


def test_toml_roundtrip():
    data = {"a": 1, "b": "x", "c": [1, 2], "d": True, "e": None, "sec": {"f": 0.5, "g": {"h": "i"}}}
    back = tomllib.loads(dumps_toml(data))
    assert back == {"a": 1, "b": "x", "c": [1, 2], "d": True, "sec": {"f": 0.5, "g": {"h": "i"}}}
