"""The cause a diagnosis quotes from a failed collective: one printable line without gloo's source location, and
whether the collective waited out its timeout or failed at once (the end-to-end diagnosis, with a frozen and a killed
rank, is in tests/train/test_elastic.py and test_two_nodes.py)."""

from __future__ import annotations

import pytest

from lcft import liveness
from lcft.liveness import Peer, cause

GLOO = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:41024: Connection reset by peer"


def test_gloo_source_location_is_dropped():
    assert cause(RuntimeError(GLOO)) == "Read error [127.0.0.1]:41024: Connection reset by peer"


def test_every_line_is_kept_on_one_printable_bounded_line():
    said = cause(RuntimeError(GLOO + "\nException raised from recvFromPeer at pair.cc:1\n\x1b[2J" + "x" * 500))
    assert "\n" not in said and said.isprintable() and len(said) <= 200
    assert said.startswith("Read error") and "Exception raised from recvFromPeer" in said and "\\x1b" in said


def test_an_error_that_says_nothing_is_named_by_its_type():
    assert cause(TimeoutError()) == "TimeoutError"


class _Beats:
    """Stands in for this process's heartbeat (rank 0, collective timeout 5 s): rank 1 on node 1 stopped beating."""

    rank, timeout_s, host, port, peers = 0, 5.0, "h", 1, {}

    def stop(self) -> None:
        pass

    def lost(self) -> tuple[list[Peer], list[int]]:
        return [Peer(1, 1, "h1", 7)], [0]

    def nodes_lost(self, lost: list[Peer], alive: list[int]) -> list[int]:
        return [1]


TIMED_OUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation"


@pytest.mark.parametrize(("error", "after"), [(RuntimeError(GLOO), "failed"), (RuntimeError(TIMED_OUT), "waited 5 s"),
                                              (TimeoutError(), "waited 5 s")])
def test_a_diagnosis_says_the_collective_waited_only_when_it_timed_out(monkeypatch, error, after):
    """A connection reset by the lost peer failed at once: the diagnosis said 'failed or waited 5 s' either way."""
    monkeypatch.setattr(liveness, "_current", _Beats())
    message, reporter = liveness.diagnose(error, "RESUME")
    assert message == (f"rank 1 on node 1 (host h1, pid 7) stopped answering (node 1 lost) after a collective "
                       f"{after} ({cause(error)}); RESUME")
    assert reporter


class _SilentStore(_Beats):
    """Stands in for this process's heartbeat (rank 1 of node 0) whose store does not answer."""

    rank, peers = 1, {0: Peer(0, 0, "h0", 5)}

    def lost(self) -> tuple[list[Peer], list[int]]:
        raise TimeoutError("no reply within 13 s")


@pytest.mark.parametrize(("agent", "server"), [("False", "rank 0 on node 0 (host h0, pid 5)"),
                                               ("True", "torchrun's agent that started rank 0 on node 0 (host h0, pid 5)")])
def test_a_store_that_does_not_answer_is_named_with_what_serves_it(monkeypatch, agent, server):
    """Rank 0 serves the store across nodes; on one node the agent does (TORCHELASTIC_USE_AGENT_STORE): the
    diagnosis named rank 0 either way."""
    monkeypatch.setattr(liveness, "_current", _SilentStore())
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent)
    monkeypatch.setenv(liveness.NODE_RANK_ENV, "0")
    message, reporter = liveness.diagnose(RuntimeError(GLOO), "RESUME")
    assert message == f"{server}, which serves the run's store at h:1, stopped answering ({cause(RuntimeError(GLOO))}); RESUME"
    assert reporter


def test_a_store_server_not_read_before_is_named_without_a_pid(monkeypatch):
    """Rank 0's own record unread when its store went (a rank still starting): it said 'pid 0'."""
    silent = _SilentStore()
    silent.peers = {}
    monkeypatch.setattr(liveness, "_current", silent)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    message, _ = liveness.diagnose(RuntimeError(GLOO), "RESUME")
    assert message.startswith("rank 0 (host h), which serves the run's store at h:1, stopped answering ("), message
