"""StopSignals: the first stop signal is noted once, repeats are ignored, and the old handlers come back; every
valid signal number has a name."""

from __future__ import annotations

import os
import re
import signal

from lcft.signals import STOP_SIGNALS, StopSignals, signal_name


def test_the_first_signal_is_noted_and_the_old_handlers_come_back():
    said: list[str] = []
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with StopSignals(said.append, "finishing the batch") as stop:
        assert stop.signum is None and stop.name is None
        os.kill(os.getpid(), signal.SIGINT)  # handled at once in the main thread: no KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # a repeat (another kind) changes nothing
        assert stop.signum == signal.SIGINT and stop.name == "SIGINT"
    assert said == ["received SIGINT: finishing the batch"]
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_the_agreed_signal_is_the_highest_any_rank_noted():
    """`agreed` hands this rank's signal number (0: none) to the reduction over ranks and returns its result: a
    rank that noted nothing takes another rank's signal; alone, its own."""
    stop = StopSignals()
    assert stop.agreed() == 0
    assert stop.agreed(lambda mine: max(mine, signal.SIGTERM)) == signal.SIGTERM  # rank 1 got SIGTERM
    with stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.agreed() == signal.SIGINT
        assert stop.agreed(lambda mine: max(mine, 0)) == signal.SIGINT
        assert stop.agreed(lambda mine: max(mine, signal.SIGTERM)) == signal.SIGTERM  # the highest number


def test_every_valid_signal_has_a_name_realtime_ones_too():
    """The realtime signals are in signal.valid_signals() but not in signal.Signals (40 raised ValueError); libc's
    description numbers them from SIGRTMIN ("Real-time signal 6"), as their names do."""
    realtime = 0
    for n in signal.valid_signals():
        if m := re.fullmatch(r"Real-time signal (\d+)", signal.strsignal(n) or ""):
            realtime += 1
            assert signal_name(n) == {0: "SIGRTMIN", signal.SIGRTMAX - signal.SIGRTMIN: "SIGRTMAX"}.get(
                int(m[1]), f"SIGRTMIN+{m[1]}"), n
        else:
            assert signal_name(n) == signal.Signals(n).name
    assert realtime == signal.SIGRTMAX - signal.SIGRTMIN + 1 and signal_name(40) == "SIGRTMIN+6"


def test_the_exit_code_comes_from_the_signal_number_a_realtime_one_too():
    """128 + N from the summary's number: worked back from the name, `signal.Signals[name]` raised KeyError on a
    realtime signal's (SIGRTMIN+1), which `signal_name` writes."""
    from lcft.signals import exit_code

    n = signal.SIGRTMIN + 1
    summary = {"stopped": "signal", "signal": signal_name(n), "signal_number": int(n)}
    assert (summary["signal"], exit_code(summary)) == ("SIGRTMIN+1", 128 + 35)
    assert exit_code({"stopped": "signal", "signal": "SIGTERM", "signal_number": 15}) == 143
    assert exit_code({"stopped": "stop_after", "signal": None, "signal_number": None}) == 0
    assert exit_code({"out": "report"}) == 0  # a finished evaluation's report


def test_a_noted_signal_is_named_as_signal_name_names_it():
    """`StopSignals.name` goes through `signal_name`: a realtime number (which a StopSignals never notes: it catches
    only SIGTERM/SIGINT) raised ValueError from `signal.Signals`."""
    stop = StopSignals()
    stop.signum = signal.SIGRTMIN + 1
    assert stop.name == "SIGRTMIN+1"
