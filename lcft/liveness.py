"""Whether this process is one rank of a launch, and which ranks still answer: every process of a launch beats a
counter in the launch's rendezvous store, and a process whose collective failed reads the counters to name the
ranks (and nodes) that stopped.

A frozen process (SIGSTOP, a hung driver) and a dead one look alike to its peers: a collective that never
completes (gloo: the collective timeout; a closed connection when the process or its node died). The
heartbeat runs on its own thread and its own store connection, so it stops exactly when the process stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from lcft.errors import LcftError, printable, reason
from lcft.spare_room import write_back

BEAT_S = 1.0  # seconds between beats; a rank is lost when its counter stands still for LOST_AFTER beats
LOST_AFTER = 3
DIAGNOSE_S = BEAT_S * LOST_AFTER + 10  # the most a survivor spends naming the lost ranks (a silent store included)
FAILURE_FILE_ENV = "LCFT_FAILURE_FILE"  # set by the launcher: where the first survivor writes the diagnosis
NODE_RANK_ENV = "LCFT_NODE_RANK"  # the user's --node-rank (torchrun's own node numbering may differ)
EXIT_LOST = 75  # a rank or node stopped answering; the latest checkpoint stands (sysexits EX_TEMPFAIL)


RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
"""How many times this node's elastic agent restarted its workers after a failure. An agent that restarts them
only because another node rejoined the rendezvous (a membership change: that node's worker failed) does not count
it, so the ranks of one restarted group can disagree: `restarts()` is the count they agree on."""

ROUND_ENV = "LCFT_RDZV_ROUND"
"""Set by lcft's agent (lcft/launch/agent.py) in the workers that share its store: the round of torch's c10d
rendezvous that formed their group, the same on every node and a new one for each group the agents form."""

LAUNCHER_ENV = "TORCHELASTIC_RUN_ID"
"""What torch's elastic agent sets in every worker it starts (torchrun, lcft's --nproc, accelerate launch), beside
env://'s variables; a job script's own exports or a shell that kept them (`source job.sh`) lack it."""


AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
""""True" where an elastic agent serves the store at MASTER_ADDR:MASTER_PORT itself (torch's default; lcft's --nproc:
on one node its own, across nodes that of the node the rendezvous ranked 0); else rank 0 serves it (lcft's
launch across nodes under a torch whose rendezvous round lcft's agent cannot read)."""


def agent_store() -> bool:
    """Whether this launch's store is served by its elastic agent (AGENT_STORE_ENV), not by rank 0."""
    return os.environ.get(AGENT_STORE_ENV) == "True"


def launched() -> bool:
    """True inside a launch by torch's elastic agent: the process group is described by the environment."""
    return LAUNCHER_ENV in os.environ


MPI_SIZE_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
"""How many copies of this command were started together by Open MPI's mpirun, a PMI launcher (MPICH, Intel MPI,
srun --mpi=pmi2), MVAPICH's, or srun: its step's task count (SLURM_NTASKS is the job's, which a one-task step
inside a larger allocation, and the batch script itself, also see)."""


def count(text: str) -> int:
    """A number of processes as the environment gives it: 1 when empty, -1 when not a number."""
    text = text.strip()
    return 1 if not text else int(text) if text.isdecimal() else -1


def refuse_copies(allowed: int = 1) -> None:
    """Raise when mpirun or srun started this command more than `allowed` times (one per node of --nnodes): each
    copy would run the whole job alone (a plain process) or start its own launch (--nproc), into the same output
    folder or rendezvous."""
    for name in MPI_SIZE_ENV:
        if (n := count(os.environ.get(name, ""))) > allowed:
            raise LcftError(f"{name}={n} in the environment: this process is one of {n} that mpirun or srun started, "
                            "and each would run the whole job alone into the same output folder; lcft starts its "
                            "own processes: run the command once per node with --nproc N, or under torchrun")


RENDEZVOUS_ENV = ("RANK", "MASTER_ADDR", "MASTER_PORT")  # what env:// reads besides WORLD_SIZE
PROCESS_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""env://'s variables as a launcher sets them in each process: a WORLD_SIZE above 1, or a LOCAL_RANK at all, makes
torch and Accelerate reach for a process group."""
START_SEVERAL = "start several with --nproc N (or torchrun)"


def launch_world() -> int:
    """The number of processes this one is launched among: the process group's size when one exists, else the
    environment's WORLD_SIZE under torch's elastic agent (1 when unset). An environment no elastic agent made
    (env://'s variables left in the shell from another job, or one of the processes of mpirun or srun) would make
    a one-process run wait for ranks that never come, fail in torch.distributed or Accelerate with a traceback,
    or run the job N times into one folder: a one-line error naming the variables instead."""
    dist = sys.modules.get("torch.distributed")  # (not imported: no group exists, and none is made here)
    if dist is not None and dist.is_available() and dist.is_initialized():  # made by Accelerate, a test harness
        return dist.get_world_size()
    given = os.environ.get("WORLD_SIZE", "")
    world = count(given)
    if world < 1:
        raise LcftError(f"WORLD_SIZE={printable(given)} in the environment is not a number of processes: unset "
                        f"{' '.join(PROCESS_ENV)} (left from another job?) to run as one process, or {START_SEVERAL}")
    if not launched():
        _refuse_foreign_launch(world)
        return 1
    missing = [k for k in RENDEZVOUS_ENV if not os.environ.get(k)]
    if world == 1 or not missing:
        return world
    raise LcftError(f"WORLD_SIZE={world} in the environment is set, but {' and '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not: unset {' '.join(PROCESS_ENV)} and "
                    f"{LAUNCHER_ENV} (left from another job?) to run as one process, or {START_SEVERAL}")


def _refuse_foreign_launch(world: int) -> None:
    """Raise when a process no elastic agent started looks launched among others: env://'s variables (a job
    script's exports, kept by the shell) or an MPI launcher's count. Neither says where the others are."""
    if world > 1 or "LOCAL_RANK" in os.environ:
        given = [k for k in PROCESS_ENV if k in os.environ]
        values = ", ".join(f"{k}={printable(os.environ[k])}" for k in given)
        raise LcftError(f"{values} in the environment, but torchrun's elastic agent did not start this process "
                        f"(torchrun and --nproc set {LAUNCHER_ENV}; lcft runs under no other launcher): "
                        f"{START_SEVERAL}, or unset {' '.join(given)} to run as one process")
    refuse_copies()


class PeerLost(LcftError):
    """A rank or node of the run stopped answering; the run ended without a new checkpoint."""

    exit_code = EXIT_LOST


@dataclass(frozen=True)
class Peer:
    """Where one rank runs, as it announced itself when it joined."""

    rank: int
    node: int | None
    host: str | None  # None (and pid None): it had not announced itself when it was read
    pid: int | None

    def __str__(self) -> str:
        node = "" if self.node is None else f" on node {self.node}"
        where = ", ".join(f"{k} {v}" for k, v in (("host", self.host), ("pid", self.pid)) if v is not None)
        return f"rank {self.rank}{node}" + (f" ({where})" if where else "")


class Heartbeat:
    """This process's beat, and the reading of everyone's, in the store at MASTER_ADDR:MASTER_PORT."""

    def __init__(self, rank: int, world: int, timeout_s: float, restarts: int) -> None:
        import torch.distributed as dist

        self.rank, self.world, self.timeout_s, self.restarts = rank, world, timeout_s, restarts
        self.host, self.port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        # (a store the agent keeps across restarts still holds the beats of the groups before: the rendezvous round
        # names each group on every node; without it, the restarts the ranks agree on)
        group = handed_round()
        self.prefix = f"lcft/liveness/{os.environ.get(LAUNCHER_ENV, 'run')}/{restarts if group is None else group}"
        self.store = dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=10),
                                   wait_for_workers=False)
        node = os.environ.get(NODE_RANK_ENV)
        me = {"node": None if node is None else int(node), "host": socket.gethostname(), "pid": os.getpid()}
        self.store.set(f"{self.prefix}/who/{rank}", json.dumps(me))
        self.peers: dict[int, Peer] = {}
        try:  # who is where, read before the first step: a store that dies with rank 0 can tell it no later
            self.store.wait([f"{self.prefix}/who/{r}" for r in range(world)], timedelta(seconds=60))
            self.peers = {r: self._peer(r) for r in range(world)}
        except Exception:  # a rank slow to start: the beat below reads who is where as it comes
            pass
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lcft-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.add(f"{self.prefix}/beat/{self.rank}", 1)
                if len(self.peers) < self.world:  # who is where, read while the store answers
                    self.peers.update({r: self._peer(r) for r in range(self.world) if r not in self.peers
                                       and self.store.check([f"{self.prefix}/who/{r}"])})
            except Exception:  # the store went away (its node died: the diagnosis will say so), or answered late
                pass  # on a loaded machine: beat again, so that who is where is still read once it answers
            self._stop.wait(BEAT_S)

    def stop(self) -> None:
        self._stop.set()

    def _counts(self) -> list[int]:
        return [self.store.add(f"{self.prefix}/beat/{r}", 0) for r in range(self.world)]

    def _peer(self, rank: int) -> Peer:
        key = f"{self.prefix}/who/{rank}"
        if not self.store.check([key]):
            return Peer(rank, None, None, None)
        who = json.loads(self.store.get(key))
        return Peer(rank, who["node"], who["host"], who["pid"])

    def lost(self) -> tuple[list[Peer], list[int]]:
        """(the ranks whose beat stood still over LOST_AFTER beats, the ranks still beating)."""
        before = self._counts()
        time.sleep(BEAT_S * LOST_AFTER)
        after = self._counts()
        alive = [r for r in range(self.world) if after[r] != before[r] or r == self.rank]
        return [self._peer(r) for r in range(self.world) if r not in alive], alive

    def nodes_lost(self, lost: list[Peer], alive: list[int]) -> list[int]:
        """The nodes none of whose ranks still beats."""
        alive_nodes = {self._peer(r).node for r in alive}
        return sorted({p.node for p in lost if p.node is not None} - alive_nodes)


_current: Heartbeat | None = None


def start(rank: int, world: int, timeout_s: float, restarts: int) -> None:
    """Start this process's heartbeat (once per process group; a no-op outside a torchrun launch); `restarts`:
    the group's, as all its ranks agreed."""
    global _current
    if _current is None and "MASTER_ADDR" in os.environ and world > 1:
        _current = Heartbeat(rank, world, timeout_s, restarts)


def scalar_device() -> str:
    """Where the few numbers of a collective go: the CPU (gloo, alone or beside NCCL), or this process's GPU in a
    group of NCCL alone (one someone else initialised)."""
    import torch
    import torch.distributed as dist

    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def own_restarts() -> int:
    """This process's agent's count of restarts (RESTART_ENV; 0 outside a launch)."""
    return int(os.environ.get(RESTART_ENV) or 0)


def handed_round() -> int | None:
    """The rendezvous round lcft's agent handed this process (ROUND_ENV), or None (another agent, or a torch whose
    round it cannot read)."""
    given = os.environ.get(ROUND_ENV, "")
    return int(given) if given.isdecimal() else None


def restarts() -> int:
    """How many times the elastic agent restarted this process's group, as all its ranks agree (`start`, while the
    heartbeat runs); this process's own count without a group."""
    return _current.restarts if _current is not None else own_restarts()


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None


def diagnose(error: BaseException, resume: str) -> tuple[str, bool] | None:
    """After `error` in a multi-process run: (a one-line message naming the ranks that stopped answering, then
    `resume` (what is kept, how to resume), whether this process is the one to report it), or None when every
    rank still beats (the error is then this process's own)."""
    hb = _current
    if hb is None:
        return None
    hb.stop()
    said = cause(error)
    try:
        lost, alive, nodes = _within(lambda: (*(r := hb.lost()), hb.nodes_lost(*r)), DIAGNOSE_S)
    except Exception:  # the store itself does not answer: rank 0 serves it, or the agent of rank 0's node
        first = hb.peers.get(0, Peer(0, None, hb.host, None))  # (its pid unknown: not read before)
        mine = os.environ.get(NODE_RANK_ENV)
        where = f" (node {first.node} lost)" if first.node is not None and str(first.node) != mine else ""
        server = f"torchrun's agent that started {first}" if agent_store() else str(first)
        return (f"{server}, which serves the run's store at {hb.host}:{hb.port}, stopped answering{where} "
                f"({said}); {resume}", True)
    if not lost:
        return None
    where = f" (node {', '.join(map(str, nodes))} lost)" if nodes else ""
    how = f"waited {hb.timeout_s:g} s" if _timed_out(error) else "failed"
    return (f"{', '.join(map(str, lost))} stopped answering{where} after a collective {how} ({said}); {resume}",
            min(alive) == hb.rank)


def _timed_out(error: BaseException) -> bool:
    """Whether a collective's error is its timeout (gloo: 'Timed out waiting Nms', NCCL's watchdog: 'collective
    operation timeout', the store: 'Socket Timeout'), not a failure at once (a peer's connection closed)."""
    return isinstance(error, TimeoutError) or re.search(r"timed? ?out", str(error), re.IGNORECASE) is not None


def _within(fn: Callable[[], Any], seconds: float) -> Any:
    """fn() on a thread of its own, or TimeoutError after `seconds`: a store served by a frozen process accepts
    the connection and never replies, whatever the client's timeout."""
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(_outcome(fn)), daemon=True)
    worker.start()
    worker.join(seconds)
    if not box:
        raise TimeoutError(f"no reply within {seconds:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _outcome(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as e:
        return False, e


def cause(error: BaseException) -> str:
    """What a failed collective said, as one printable line of at most 200 characters (errors.reason), without
    the C++ source location gloo puts in front ('[.../pair.cc:534] ')."""
    return re.sub(r"^\[[^\]]*\]\s*", "", reason(error, 200))


def report(message: str, reporter: bool) -> None:
    """Hand the diagnosis to the launcher (the first survivor's file wins), or print it (the lowest surviving
    rank only) when there is none."""
    path = os.environ.get(FAILURE_FILE_ENV)
    if path:
        try:
            write_back(lambda: _write_new(path, message + "\n"))
            return
        except FileExistsError:
            return
        except OSError:  # the launcher's folder cannot take it, even with its spare room freed: said here
            pass
    if reporter:
        print(f"error: {message}", file=sys.stderr, flush=True)


def _write_new(path: str, text: str) -> None:
    """Write `text` into a file not yet there (FileExistsError when it is: another process was first)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError:  # (a full file system takes the name, not the text): an empty report would be taken as none
        os.unlink(path)
        raise


def read_report(path: Path) -> str | None:
    """The diagnosis a worker left in the launcher's failure file (None when there is none)."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip() or None
    return None
