"""Memory sizes (`--gpu-memory`, `--host-memory`: lcft.plan.config.parse_bytes): the units taken, and one line for
a size no GPU or node has or a unit in another case, saying what to write."""

from __future__ import annotations

import pytest

from lcft.config import ConfigError
from lcft.plan.config import parse_bytes
from lcft.plan.estimate import GIB
from tests.one_line import cli_fails


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == parse_bytes("80G") == parse_bytes("80g") == parse_bytes(" 80 GiB ") == 80 << 30
    assert parse_bytes("141GB") == 141 * 10**9
    assert parse_bytes("1536MiB") == 1536 << 20 and parse_bytes("1.5G") == 3 << 29
    assert parse_bytes("1048576KiB") == parse_bytes(str(GIB)) == parse_bytes(f"{GIB}B") == GIB  # bare: bytes
    assert parse_bytes("1024TiB") == 1 << 50 and parse_bytes(str(1 << 60)) == 1 << 60


@pytest.mark.parametrize("text,needle", [
    ("80iB", "not a memory size"), ("80i", "not a memory size"),  # a binary mark without a multiple
    ("80Gb", "not a memory size"), ("80gib", "not a memory size"),  # b is bits
    ("80GIB", "not a memory size"), ("80GiBB", "not a memory size"), ("80 G B", "not a memory size"),
    ("0.5", "under 1 GiB"), ("0", "under 1 GiB"), ("0.0001K", "under 1 GiB"),  # rounds to 0 bytes
    ("9" * 400 + "G", "limit of 1 EiB"), ("9" * 400 + ".5", "limit of 1 EiB"), (str((1 << 60) + 1), "limit of 1 EiB"),
    ("9" * 5000, "too many digits"),
])
def test_parse_bytes_refuses_what_the_help_does_not_name(text, needle) -> None:
    with pytest.raises(ConfigError, match=needle) as e:
        parse_bytes(text, "host_memory")
    assert str(e.value).startswith("host_memory") and "\n" not in str(e.value)


@pytest.mark.parametrize("option", ["--gpu-memory", "--host-memory"])
def test_a_memory_size_under_1_gib_or_in_another_case_names_what_was_meant(option) -> None:
    """`--gpu-memory 80` was 80 bytes (a plan of "146.51 GiB of 0.00 GiB", nothing fits), and `80gb` was "not a memory
    size" with no word of the case: each is one line saying what to write; 1 GiB itself is taken."""
    name = option.removeprefix("--").replace("-", "_")
    for value, said in [("80", f"{name}: '80' is 80 bytes, under 1 GiB: did you mean 80GiB or 80GB?"),
                        (str(GIB - 1), f"{name}: '{GIB - 1}' is {GIB - 1} bytes, under 1 GiB: did you mean "
                                       f"{GIB - 1}GiB or {GIB - 1}GB?"),
                        ("512MiB", f"{name}: '512MiB' is under 1 GiB, less than any GPU or node has (e.g. 80GiB, "
                                   "141GB, 24G)"),
                        ("80gb", f"{name}: not a memory size: '80gb'; write 80GB for 80 x 10^9 bytes or 80GiB for "
                                 "80 x 2^30 bytes"),
                        ("2tib", f"{name}: not a memory size: '2tib'; write 2TB for 2 x 10^12 bytes or 2TiB for "
                                 "2 x 2^40 bytes")]:
        said = said.replace(name, option, 1)  # the CLI names the option as it was given
        assert cli_fails(["plan", "--preset", "tiny", "--seq-len", "4K", option, value]) == f"error: {said}"
    assert parse_bytes(str(GIB), name) == parse_bytes("1G", name) == GIB


@pytest.mark.parametrize("option,value", [("--gpu-memory", "9" * 400 + "G"), ("--host-memory", "9" * 400),
                                          ("--gpu-memory", "0.5"), ("--gpu-memory", "80Gb")])
def test_cli_memory_sizes_are_one_line(option, value) -> None:
    cli_fails(["plan", "--preset", "tiny", "--seq-len", "4K", option, value], f"error: {option}")
