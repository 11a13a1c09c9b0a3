"""torchrun's elastic agent as the launcher starts it (`python -m lcft.launch.agent TORCHRUN-ARGS`): it ends
when its launcher dies, records how each failed worker ended (an exit code, or the signal that killed it) for the
launcher to name, ends on a signal sent to it (a scheduler's, to every process of the job) with exit code
128 + N once its workers saved or the launch's --stop-grace ran out (then SIGKILLed), on a rendezvous that another
node closed (it gave up on the run) or took down with exit code 75 (liveness.EXIT_LOST), and on one that did not
gather every node within its join timeout with process.EXIT_NOT_GATHERED, each instead of torchrun's traceback.
It hands each group's workers the round of the rendezvous that formed it (`_hand_round`), their store's prefix,
and names the workers it ends for another cause than a stop signal (`_name_ended_groups`).
torch's log lines that only repeat how it ended, which the launcher says in its own line, are left out
(`_RepeatedEnds`); every other one is printed."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
from typing import Any

from lcft.files import atomic_write
from lcft.launch.process import EXIT_NOT_GATHERED, FAILURES_ENV, die_with_parent
from lcft.liveness import EXIT_LOST, ROUND_ENV
from lcft.signals import GROUP_ENDING_ENV, STOP_SIGNALS, signal_name
from lcft.spare_room import write_back

_ended: set[int] = set()
"""The pids of the workers the agent ended with their group (`_name_ended_groups`): still running when it began to
close it for another cause than its own stop signal. One it SIGKILLs once the close's 30 s ran out (a rank still
saving, or slowed on a loaded machine) was ended by the agent, as by its SIGTERM: no cause of the failure. Those of
the group last closed only: a worker of a later group may have an earlier one's pid."""


def failures(error: Any) -> list[dict[str, Any]]:
    """The failed workers of a ChildFailedError (or of a failed group's RunResult): global rank, pid, exit code, the
    signal that killed it, and whether the launch stopped it: a signal a launch stops its workers with (the agent
    ends the others with SIGTERM), or SIGKILL, the agent's, of a worker it ended with its group (`_ended`)."""
    out = []
    for rank, f in sorted(error.failures.items()):
        sig = -f.exitcode if f.exitcode < 0 and -f.exitcode in signal.valid_signals() else None
        # (the agent's own kill is SIGKILL: a worker ended with its group and killed by another signal meanwhile,
        # the OOM killer's or an operator's, is a cause)
        stopped = sig in STOP_SIGNALS or (sig == signal.SIGKILL and int(f.pid) in _ended)
        out.append({"rank": int(rank), "pid": int(f.pid), "exitcode": int(f.exitcode),
                    "signal": signal_name(sig) if sig else None, "stopped": stopped})
    return out


# torch's elastic loggers whose records of how the agent ended the launcher repeats in its own line.
_TORCH_LOGGERS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api",
                  "torch.distributed.elastic.rendezvous.dynamic_rendezvous")


class _RepeatedEnds(logging.Filter):
    """Drops torch's records (matched by message format, the text before its arguments) that repeat what the
    launcher's line says: the stop signal the agent got and passed on, and the workers it then ended; a failed
    worker where the agent then ends (no --max-restarts, or its restarts spent; else torch's line is the only word
    of a failure it restarts the group for), or one that exited EXIT_LOST, having named the lost rank itself; the
    store of node 0's agent, which hosts the rendezvous, gone (a keep-alive heartbeat, the last call, that cannot
    connect). Kept: all else, such as a worker that would not end, a rendezvous error of another kind, an exception."""

    def __init__(self, restarts: int) -> None:
        super().__init__()
        self.restarts = restarts
        self.failed = 0  # the group's failures on this node so far: each spends a restart, the one after the last ends

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith(("Received %s death signal", "Got termination signal", "Sending process %s closing")):
            return False
        if msg.startswith("failed (exitcode: %s)") and isinstance(record.args, tuple):  # (torch: one per failure)
            self.failed += 1
            return self.failed <= self.restarts and record.args[0] != EXIT_LOST
        # (these two are formatted before logging)
        host_gone = msg.endswith("due to an error of type RendezvousConnectionError.") and (
            "failed to send a keep-alive heartbeat" in msg or "failed to shutdown the rendezvous" in msg)
        return not host_gone


def _quiet_repeated_ends(restarts: int) -> None:
    """Leave torch's log lines that repeat the launcher's out of this agent's stderr (`_RepeatedEnds`; a run
    under --max-restarts `restarts`), unless the user set torch's LOGLEVEL: then every one is printed."""
    if "LOGLEVEL" in os.environ:
        return
    for name in _TORCH_LOGGERS:
        logging.getLogger(name).addFilter(_RepeatedEnds(restarts))


def _shutdown_timeout(argv: list[str]) -> list[str]:
    """torchrun's arguments as this torch takes them. `--shutdown-timeout=G` (the launch's --stop-grace: how long
    the agent waits for its workers after its SIGTERM before it SIGKILLs them) is torchrun's own flag where it has
    one; an older torch (before its LaunchConfig.shutdown_timeout) always waited 30 s, so the flag is taken out and
    G becomes the wait of the closes that end the agent's run (on its signal, or once it ended), as torchrun's flag
    does: the close of a group it restarts keeps its 30 s (a worker still saving when another failed)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.launcher.api import LaunchConfig

    given = [a for a in argv if a.startswith("--shutdown-timeout=")]
    if not given or "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}:
        return argv
    grace = int(given[-1].partition("=")[2])
    invoke = LocalElasticAgent._invoke_run

    def invoke_then_grace(self: LocalElasticAgent, *args: Any, **kwargs: Any) -> Any:
        # The agent's run closes its workers after this returns or raises (SignalException too); the restarts'
        # closes (_stop_workers) come within it.
        try:
            return invoke(self, *args, **kwargs)
        finally:
            if self._pcontext is not None:
                self._pcontext.close = functools.partial(type(self._pcontext).close, self._pcontext, timeout=grace)

    LocalElasticAgent._invoke_run = invoke_then_grace  # type: ignore[method-assign]
    return [a for a in argv if a not in given]


def _name_ended_groups() -> None:
    """Before the agent SIGTERMs a group's workers for any cause but its own stop signal (a worker failed: torch
    ends the others at once; a restart; the run's end), name them in GROUP_ENDING_ENV's file
    (lcft.signals.ended_with_group): each then stops without saying it saves, which it could not. The agent's own
    stop signal ends them while its SignalException is handled (torch's agent run), and names none: they save."""
    from torch.distributed.elastic.multiprocessing.api import PContext, SignalException

    path, close = os.environ.get(GROUP_ENDING_ENV), PContext.close
    if not path:
        return

    def name_then_close(self: PContext, *args: Any, **kwargs: Any) -> None:
        if not getattr(self, "_lcft_closed", False):  # a new group: an earlier one's pids may be reused by its workers
            _ended.clear()
            self._lcft_closed = True
        if not isinstance(sys.exc_info()[1], SignalException):
            # (a binary's workers, as the launch starts them; a worker already ended is the failure, or none)
            handlers = getattr(self, "subprocess_handlers", {}).values()
            _ended.update(h.proc.pid for h in handlers if h.proc.poll() is None)
            pids = "".join(f"{pid}\n" for pid in self.pids().values())
            with contextlib.suppress(OSError):  # (unnamed, a worker says it saves, as before)
                write_back(lambda: atomic_write(path, pids))
        close(self, *args, **kwargs)

    PContext.close = name_then_close  # type: ignore[method-assign]


def _record(error: Any) -> None:
    """Write the failed workers of `error` (`failures`) into FAILURES_ENV's file for the launcher to name. A folder
    that cannot take it, even with the spare room freed: the launcher reads no failures, and its line points to
    the workers' errors above (or, on a restart, says the other ranks' diagnosis)."""
    if path := os.environ.get(FAILURES_ENV):
        text = json.dumps(failures(error))
        with contextlib.suppress(OSError):
            write_back(lambda: atomic_write(path, text))


def _record_each_failure() -> None:
    """Record the failed workers of every group that fails (`_record`), not only of the last: under --max-restarts
    the launcher's 'restarting: ...' line names a worker killed by a signal as its run's error would."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    monitor = LocalElasticAgent._monitor_workers

    def monitor_then_record(self: LocalElasticAgent, *args: Any, **kwargs: Any) -> Any:
        result = monitor(self, *args, **kwargs)
        if result.state == WorkerState.FAILED and result.failures:  # (the agent restarts the group, or ends)
            _record(result)
        return result

    LocalElasticAgent._monitor_workers = monitor_then_record  # type: ignore[method-assign]


SHARE_OFF_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch: "1" and rank 0 serves the workers' store (a port its agent picked free and let go), not the agent."""


def _round(handler: Any) -> int | None:
    """The round of torch's c10d rendezvous `handler` holds (DynamicRendezvousHandler._state_holder.state.round,
    torch 2.11 to 2.13: the same on every node, one more each time the nodes form a group again), or None where
    this torch keeps no such state (then nothing is guessed)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    if not isinstance(handler, DynamicRendezvousHandler):
        return None
    value = getattr(getattr(getattr(handler, "_state_holder", None), "state", None), "round", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _hand_round(across: bool) -> None:
    """Give the workers of each group the round of the rendezvous that formed it (liveness.ROUND_ENV, in the
    agent's environment, which its workers inherit), so that they share the agent's store under a prefix the
    nodes agree on (mesh._round_store) where each agent counts its restarts its own way: torch binds that store
    at a port of the OS's choice, in the agent the rendezvous ranks 0, before any worker starts. Until a
    rendezvous whose round can be read, nodes `across` the launch leave the store to rank 0, a new one per group
    (SHARE_OFF_ENV; the user's own setting of it stands)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    given = os.environ.get(SHARE_OFF_ENV)
    if across:
        os.environ[SHARE_OFF_ENV] = "1"
    next_rendezvous = DynamicRendezvousHandler.next_rendezvous

    def next_then_round(self: DynamicRendezvousHandler) -> Any:
        if _round(self) is None or not hasattr(self, "_bootstrap_store_info"):
            return next_rendezvous(self)
        # (torch reads the switch within the rendezvous, and again as it starts the workers)
        if given is None:
            os.environ.pop(SHARE_OFF_ENV, None)
        else:
            os.environ[SHARE_OFF_ENV] = given
        # torch keeps the store's address from the first group it formed (torch 2.11 and 2.13), while a node that
        # replaces the one serving it may rank 0 (it serves a new store there: the others were given the dead
        # one's address), or a survivor (torch 2.11 fails an assertion): forgotten, the agent the rendezvous ranks
        # 0 serves a new store for each group, and every node reads its address from that round's keys.
        self._bootstrap_store_info = None
        info = next_rendezvous(self)
        os.environ[ROUND_ENV] = str(_round(self))  # (read at once: the round moves on only once every node left it)
        return info

    DynamicRendezvousHandler.next_rendezvous = next_then_round  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    die_with_parent()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )
    from torch.distributed.run import parse_args, run

    args = parse_args(_shutdown_timeout(argv))
    _hand_round(across=not args.standalone)
    _quiet_repeated_ends(args.max_restarts)
    _name_ended_groups()
    _record_each_failure()
    try:
        run(args)
    except SignalException as e:  # (torch raises it from its handler, after ending the workers with it)
        return 128 + int(e.sigval)  # (the launcher's _agent_ended reads it)
    except ChildFailedError as e:
        _record(e)
        return 1
    # Another node's agent gave up on the run (its restarts spent) and closed the rendezvous, or node 0's, which
    # hosts it, ended: nothing to rejoin. (The launcher names it: _agent_ended.)
    except (RendezvousClosedError, RendezvousConnectionError):
        return EXIT_LOST
    except RendezvousTimeoutError:  # a node never came (or did not come back for a restart)
        return EXIT_NOT_GATHERED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
