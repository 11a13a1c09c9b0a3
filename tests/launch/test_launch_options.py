"""The launch options (--nnodes, --node-rank, --rdzv-endpoint, --max-restarts, --collective-timeout, --stop-grace): checked when
a config is built, neutral for the trajectory, and the exit code a finished command reports."""

from __future__ import annotations

import pytest

from lcft.config import ConfigError
from lcft.parallel.config import ParallelConfig
from lcft.signals import exit_code
from lcft.train.config import TrainConfig, resolve_config


@pytest.mark.parametrize(("changes", "message"), [
    (dict(nnodes=0), "nnodes must be at least 1"),
    (dict(nproc=2**20 + 1), r"nproc must be at most 1,048,576 \(lcft's limit of processes or nodes\), got 1048577"),
    (dict(nnodes=10**320, rdzv_endpoint="h:1"), "nnodes must be at most 1,048,576"),
    (dict(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), r"node_rank must be within .* = \[0, 1\], got 2"),
    (dict(node_rank=-1), "node_rank must be within"),
    (dict(nnodes=2), "rdzv_endpoint: give node 0's HOST:PORT"),
    (dict(nnodes=2, rdzv_endpoint="host"), "rdzv_endpoint must be HOST:PORT"),
    (dict(nnodes=2, rdzv_endpoint="host:0"), "rdzv_endpoint must be HOST:PORT"),
    (dict(nnodes=2, rdzv_endpoint="a b:1"), "rdzv_endpoint must be HOST:PORT"),  # torch's ValueError in each worker
    (dict(nnodes=2, rdzv_endpoint="h/x:1"), "rdzv_endpoint must be HOST:PORT"),
    (dict(nnodes=2, rdzv_endpoint="h:١٢"), "rdzv_endpoint must be HOST:PORT"),  # digits, but not ASCII ones
    (dict(max_restarts=-1), "max_restarts must not be negative"),
    (dict(collective_timeout=0.0), "collective_timeout must be a positive number"),
    (dict(collective_timeout=float("inf")), "collective_timeout must be a positive number"),
    (dict(collective_timeout=float("nan")), "collective_timeout must be a positive number"),
    (dict(stop_grace=0), r"stop_grace must be a positive number of seconds, at most 2,592,000 \(30 days\), got 0"),
    (dict(stop_grace=30 * 86400 + 1), "stop_grace must be a positive number of seconds"),  # torch's TIMEOUT_MAX
])
def test_bad_launch_options_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        ParallelConfig(**changes)


def test_the_largest_counts_of_processes_and_nodes_are_accepted():
    cfg = ParallelConfig(nproc=2**20, nnodes=2**20, rdzv_endpoint="h:1")
    assert (cfg.nproc, cfg.nnodes) == (2**20, 2**20)


def test_launch_options_from_flags_and_who_launches():
    cfg = resolve_config(flags=dict(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500", max_restarts=3,
                                    collective_timeout=30.0, stop_grace=45))
    assert (cfg.nnodes, cfg.node_rank, cfg.rdzv_endpoint, cfg.max_restarts, cfg.collective_timeout,
            cfg.stop_grace) == (2, 1, "10.0.0.1:29500", 3, 30.0, 45)
    assert cfg.multiprocess and TrainConfig(max_restarts=1).multiprocess and TrainConfig(nproc=2).multiprocess
    assert not TrainConfig().multiprocess


def test_launch_options_do_not_define_the_run():
    """A run continued on another layout, timeout or restart budget is the same run."""
    a = TrainConfig(data="d", out="o")
    b = TrainConfig(data="d", out="o", nproc=2, nnodes=2, node_rank=1, rdzv_endpoint="h:1", max_restarts=2,
                    collective_timeout=5.0, stop_grace=10)
    assert a.run_defining() == b.run_defining()


def test_exit_code_of_a_summary():
    assert exit_code({"stopped": "done", "signal": None, "signal_number": None}) == 0
    assert exit_code({"stopped": "stop_after", "signal": None, "signal_number": None}) == 0
    assert exit_code({"stopped": "signal", "signal": "SIGTERM", "signal_number": 15}) == 143
    assert exit_code({"stopped": "signal", "signal": "SIGINT", "signal_number": 2}) == 130
    assert exit_code({"run_dir": "x", "node_rank": 1, "stopped": "done"}) == 0


@pytest.mark.parametrize("endpoint", ["node0:29500", "10.0.0.1:29500", "[fe80::1]:29500", "gpu-01.cluster.local:1"])
def test_every_endpoint_torch_takes_is_taken_as_torch_parses_it(endpoint):
    """Oracle: torch's own parser of the rendezvous endpoint agrees on host and port."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    cfg = ParallelConfig(nnodes=2, rdzv_endpoint=endpoint)
    host, port = parse_rendezvous_endpoint(cfg.rdzv_endpoint, 1)
    assert endpoint.endswith(f":{port}") and host in endpoint
