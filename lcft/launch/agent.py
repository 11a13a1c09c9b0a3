"""torchrun's elastic agent as the launcher starts it (`python -m lcft.launch.agent TORCHRUN-ARGS`): it ends
when its launcher dies, records how each failed worker ended (an exit code, or the signal that killed it) for the
launcher to name, ends on a signal sent to it (a scheduler's, to every process of the job) with exit code
128 + N once its workers saved or the launch's --stop-grace ran out (then SIGKILLed), on a rendezvous that another
node closed (it gave up on the run) or took down with exit code 75 (liveness.EXIT_LOST), and on one that did not
gather every node within its join timeout with process.EXIT_NOT_GATHERED, each instead of torchrun's traceback."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from typing import Any

from lcft.launch.process import EXIT_NOT_GATHERED, FAILURES_ENV, die_with_parent
from lcft.liveness import EXIT_LOST
from lcft.signals import STOP_SIGNALS, signal_name


def failures(error: BaseException) -> list[dict[str, Any]]:
    """The failed workers of a ChildFailedError: global rank, pid, exit code, the signal that killed it, and
    whether that signal is one a launch stops its workers with (the agent ends the others with SIGTERM)."""
    out = []
    for rank, f in sorted(error.failures.items()):  # type: ignore[attr-defined]
        sig = -f.exitcode if f.exitcode < 0 and -f.exitcode in signal.valid_signals() else None
        out.append({"rank": int(rank), "pid": int(f.pid), "exitcode": int(f.exitcode),
                    "signal": signal_name(sig) if sig else None, "stopped": sig in STOP_SIGNALS})
    return out


def _shutdown_timeout(argv: list[str]) -> list[str]:
    """torchrun's arguments as this torch takes them. `--shutdown-timeout=G` (the launch's --stop-grace: how long
    the agent waits for its workers after its SIGTERM before it SIGKILLs them) is torchrun's own flag where it has
    one; an older torch (before its LaunchConfig.shutdown_timeout) always waited 30 s, so the flag is taken out
    and G becomes the wait of every close of its workers (there before a restart too)."""
    from torch.distributed.elastic.multiprocessing.api import PContext
    from torch.distributed.launcher.api import LaunchConfig

    given = [a for a in argv if a.startswith("--shutdown-timeout=")]
    if not given or "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}:
        return argv
    grace = int(given[-1].partition("=")[2])
    close = PContext.close

    def close_after_grace(self: PContext, death_sig: signal.Signals | None = None, timeout: int = grace) -> None:
        close(self, death_sig, timeout)

    PContext.close = close_after_grace  # type: ignore[method-assign]
    return [a for a in argv if a not in given]


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

    try:
        run(parse_args(_shutdown_timeout(argv)))
    except SignalException as e:  # (torch raises it from its handler, after ending the workers with it)
        return 128 + int(e.sigval)  # (the launcher's _agent_ended reads it)
    except ChildFailedError as e:
        if path := os.environ.get(FAILURES_ENV):
            with open(path, "w") as f:
                json.dump(failures(e), f)
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
