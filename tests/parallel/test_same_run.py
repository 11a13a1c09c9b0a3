"""Every rank runs the same run (lcft.parallel.same_run): the fingerprint leaves out what each node gives its own
value and compares paths by what they hold; a rank of other software, options or inputs is named, in one line,
on every rank, from what the ranks gathered."""

from __future__ import annotations

import pytest
import torch

from lcft.config_toml import to_dict
from lcft.parallel import same_run
from lcft.parallel.same_run import PER_NODE, differences, fingerprint
from lcft.train import TrainConfig
from tests.parallel.harness import run_ranks
from tests.parallel.workers import same_run_check


def _node(node: int, fields: dict[str, str]) -> dict:
    return {"node": node, "fields": fields}


@pytest.mark.distributed
def test_a_node_of_another_lcft_version_is_the_same_line_on_every_rank():
    """Two ranks, node 1's lcft another version: both raise the same line naming node 1 and both versions. They
    went on together into the run's collectives (a silent run, or a mismatch far from the cause)."""
    got = run_ranks(same_run_check, 2, ["0.1.0", "0.2.0"])
    assert got == ["node 1 runs another run than node 0: lcft 0.2.0 vs 0.1.0 (give every node the same lcft and "
                   "torch installed)"] * 2


@pytest.mark.distributed
def test_ranks_that_differ_only_in_their_node_rank_go_on():
    assert run_ranks(same_run_check, 2, ["0.1.0", "0.1.0"]) == [None, None]


def test_another_torch_or_lcft_source_is_named(monkeypatch):
    """The software of a rank: torch's version and lcft's source (clones at other commits share the version)."""
    mine = fingerprint({}, {})
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    monkeypatch.setattr(same_run, "source_digest", lambda: "0123456789abcdef")
    other = fingerprint({}, {})
    assert differences([_node(0, mine), _node(1, other)]) == (
        f"node 1 runs another run than node 0: lcft source 0123456789abcdef vs {mine['lcft source']}; torch 2.99.0 "
        f"vs {mine['torch']} (give every node the same lcft and torch installed)")


def test_per_node_options_and_paths_are_not_compared_but_what_the_paths_hold_is(tmp_path):
    """Node 1's own number, its spelling of node 0's address, its agent's restarts and grace, its live view, and
    its own copy of the data at another path: the same run. Another --lr, or data of another content, is not."""
    base = dict(data=str(tmp_path / "a"), out=str(tmp_path / "run"), nnodes=2, rdzv_endpoint="node0:29500")
    node0 = fingerprint(to_dict(TrainConfig(**base)), {"data": "aaaa"})
    node1 = fingerprint(to_dict(TrainConfig(**{**base, "data": str(tmp_path / "b"), "rdzv_endpoint": "10.0.0.1:29500"},
                                            node_rank=1, max_restarts=2, stop_grace=30, progress=False)), {"data": "aaaa"})
    assert node0 == node1 and not PER_NODE & node0.keys()
    other = fingerprint(to_dict(TrainConfig(**base, lr=1e-3, seq_len=4096)), {"data": "bbbb"})
    assert differences([_node(0, node0), _node(1, other)]) == (
        "node 1 runs another run than node 0: data bbbb vs aaaa; lr 0.001 vs 0.0003; seq_len 4096 vs None (give "
        "every node the same options and the same data and checkpoints, at whatever path)")


def test_each_node_that_differs_is_named_once_against_the_lowest_node():
    """Rank 0 on node 1 (the rendezvous places it): the reference is node 0 all the same; two ranks of node 2
    make one mention; a field one side lacks (another lcft's) shows as none; many fields are cut short."""
    same, lr = {"lr": "0.001"}, {"lr": "0.01"}
    ranks = [_node(1, same), _node(1, same), _node(0, same), _node(0, same), _node(2, lr), _node(2, lr),
             _node(3, {**same, "new": "1"})]
    assert differences(ranks) == ("node 2 runs another run than node 0: lr 0.01 vs 0.001; node 3 runs another run "
                                  "than node 0: new 1 vs none (give every node the same options)")
    many = {f"f{i}": "1" for i in range(10)}
    line = differences([_node(0, {}), _node(1, many)])
    assert "; and 2 more (" in line and "f7 1 vs none" in line and "f8" not in line
