"""The tile table is the search's results as recorded: every choice compiled clean under each supported triton."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcft.kernels.triton_tile_table import NO_CLEAN
from lcft.kernels.triton_tiles import DTYPES, tile_config

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_tiles.jsonl"
TRITONS = ("3.6.0", "3.9.0")  # torch 2.11's (make test-oldest-torch) and constraints.txt's
BY_NAME = {v: k for k, v in DTYPES.items()}
ROWS = [json.loads(line) for line in RESULTS.read_text().splitlines()]


def test_the_results_cover_every_kernel_of_the_table_targets():
    keys = {(tuple(r["arch"]), r["dtype"], r["head_dim"], r["block"], r["group"], r["kernel"]) for r in ROWS}
    assert len(keys) == len(ROWS)  # one result per kernel
    for dtype in ("bf16", "fp16", "fp32"):
        # 3 targets x 3 head_dims x 2 blocks x 4 groups x 3 kernels
        assert sum(1 for k in keys if k[1] == dtype) == 3 * 3 * 2 * 4 * 3


@pytest.mark.parametrize("version", TRITONS)
def test_every_recorded_choice_compiled_clean_with_each_triton(version):
    """`kernel_tile_search.py --recheck`, run with each venv's python, recorded the choice's usage per version:
    every bf16/fp16 choice is clean under both; an fp32 one may not be only where the table says why."""
    for r in ROWS:
        u = r.get("checked", {}).get(version)
        assert u is not None, r
        key = (r["arch"][0] * 10 + r["arch"][1], r["dtype"], r["head_dim"], r["block"], r["gp"])
        listed = r["kernel"] in NO_CLEAN.get(key, {})
        assert listed == (not r["clean"]), r
        ok = u["spill"] == 0 and u["regs"] is not None and u["regs"] < 255
        assert ok or (listed and r["dtype"] == "fp32"), r


def test_the_table_gives_each_kernel_its_recorded_choice():
    """lcft/kernels/triton_tile_table.py is `--write` of these results: the tiles a run gets are the choices."""
    for r in ROWS:
        tiles = tile_config(tuple(r["arch"]), BY_NAME[r["dtype"]], r["head_dim"], r["block"], r["group"])
        assert list(tiles.kernel_params(r["kernel"])) == r["chosen"]["params"], r
