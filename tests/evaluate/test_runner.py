"""An evaluation's fingerprint (lcft.evaluate.runner._same_run): its options as the evaluation takes them, so two
nodes given one evaluation two ways run it, and two evaluations are still told apart."""

from __future__ import annotations

import pytest

from tests.evaluate.conftest import WINDOW
from tests.parallel.harness import run_ranks
from tests.parallel.workers import eval_same_run_checks


@pytest.mark.distributed
def test_one_evaluation_given_two_ways_is_the_same_run_and_another_is_not(data_dir, ckpt_a, tmp_path):
    """Two ranks (two nodes) pass the same-run check where one gives --device auto and the other the device it
    picks here (the CPU), --max-context 0 (the whole window) and none, --max-windows above the split's count and
    0 (all), the copy probe's options without --probe (no probe runs) and none, --cp-kv without cp and none, and
    with --probe copy its distances and --probe-windows as given and as it takes them. Each was named another run.
    Another --max-context still is."""
    base = dict(data=str(data_dir), checkpoints=(str(ckpt_a),), out=str(tmp_path / "eval"), bootstrap=10)
    probe = {**base, "probe": "copy"}
    same = [
        [{**base, "device": "auto"}, {**base, "device": "cpu"}],
        [base, {**base, "max_context": (0,)}],
        [base, {**base, "max_windows": 10**6}],
        [base, {**base, "probe_segment": 512, "probe_windows": 3}],
        [base, {**base, "cp_kv": "stream", "cp_layout": "contiguous"}],
        # segment, 2 segments, 4 ..., below the window less a segment, then that: the farthest a copy fits
        [probe, {**probe, "probe_distances": (256, 512, 1024, WINDOW - 256), "probe_windows": 10**6}],
    ]
    other = [[base, {**base, "max_context": (512,)}]]
    got = run_ranks(eval_same_run_checks, 2, same + other)
    assert got[0] == got[1] == [None] * len(same) + [
        "node 1 runs another run than node 0: max_context [512] vs [0] (give every node the same options)"]
