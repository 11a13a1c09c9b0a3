"""`--nproc N` (and `--nnodes`, `--max-restarts`) for `lcft train` and `lcft eval`: `run(job, cfg)` runs the job
in this process, or starts the processes of a run through torchrun's elastic agent (c10d rendezvous), gloo on CPU.

First, in this process too, the job's checks that need no torch run, before its modules are imported (the world
splits into context-parallel groups, the batch into replicas, the inputs are found): such a user error answers
at once. Before a launch writes anything, what else needs no process group runs here (eval: the split's files
verified); then node 0's launcher takes the output folder's lock, which its rank 0 re-enters, so a second launch
into the folder is refused from the first byte, and checks the folder takes the run. The resolved config goes to a private temporary folder of this launch with the workers' reports;
the parent runs `python -m lcft.launch.agent --standalone|--rdzv-* --nproc-per-node N --max-restarts R
--shutdown-timeout G -m lcft.launch JOB SPEC.toml` (torchrun's agent, lcft/launch/agent.py; the worker entry is lcft/launch/__main__.py),
passes SIGTERM/SIGINT on to the workers (training ones finish the step, checkpoint and exit; eval ones finish the
batch, keep its losses and exit; an agent that got the signal too kills them --stop-grace G s after it; one that comes while the agent still waits for the other nodes ends it at
once, no worker started), ends them at once on a second signal, when one of them is frozen, or on a
rank's user error (then raised as that rank raised it, its exit code too; a stop signal while the launcher waits
for the other ranks' errors ends on it), and returns the summary the node's first rank handed back (rank 0's, or
the same run's on a node without rank 0: its exit code is the run's, no shared folder needed). The agent and the
workers end with their parent. Several nodes: the same command on every node with its own `--node-rank` and
node 0's `--rdzv-endpoint`. Inside a torchrun launch started by hand, `--nproc` and the launch options are
ignored.

Exit codes of `lcft train` and `lcft eval` (what a scheduler sees): 0 the run finished (or --stop-after was
reached); 1 a user error (fix the command; a rerun fails the same way; a few carry their own code); 128 + N stopped
by signal N after saving (a checkpoint; eval: the losses of its batch) (143 SIGTERM, 130 SIGINT; or killed by it
before saving), whether torchrun's agent got it too or not; 75 a rank or node stopped answering, died or was killed
by a signal, or the agent was, its workers with it, or another node gave up on the run and closed (or took down) its
rendezvous, or did not come back to it for a restart within --collective-timeout (nothing new saved). After 143, 130 and 75, train's `--resume auto` continues from the latest verified
checkpoint, and eval run again resumes from its kept losses.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lcft.config_toml import save_resolved, to_dict
from lcft.cpus import omp_threads, usable_cpus
from lcft.errors import LcftError
from lcft.folder_lock import HELD_LOCK_ENV, folder_lock
from lcft.launch.jobs import JOBS, Entry, job
from lcft.launch.process import (
    EXIT_NOT_GATHERED,
    FAILURES_ENV,
    HANDED_ENV,
    PARENT_ENV,
    READY_ENV,
    RESULT_FILE_ENV,
    Handed,
    killed_workers,
)
from lcft.launch.supervisor import Supervisor
from lcft.launch.temp_folder import FILES, launch_folder
from lcft.liveness import (
    EXIT_LOST,
    FAILURE_FILE_ENV,
    NODE_RANK_ENV,
    PeerLost,
    launch_world,
    launched,
    read_report,
    refuse_copies,
)
from lcft.signals import Stopped, signal_name
from lcft.spare_room import SPARE_ENV, reserve, unwritable

__all__ = ["EXIT_LOST", "JOBS", "PeerLost", "RESULT_FILE_ENV", "launch", "run"]

def run(name: str, cfg: Any, **kwargs: Any) -> dict[str, Any]:
    """Run job `name` ("train" or "eval") as cfg says and return its summary: in this process (kwargs go to
    the job: hooks, progress), or, when cfg asks for several processes (--nproc, --nnodes, --max-restarts)
    and this process is not already one of a launch, in cfg.nproc launched processes on this node."""
    entry = job(name).entry()  # its checks: no torch yet
    cfg = entry.resolve(cfg)
    if launched():  # one process of a launch started by hand: its world is torchrun's, the job checks it
        return entry.work(cfg, **kwargs)
    if cfg.multiprocess:  # mpirun/srun -n N starting N launches into one folder (--nnodes: one per node is right)
        refuse_copies(allowed=cfg.nnodes)
    # one process: a launch environment no launcher made (left in the shell, mpirun's) is the first thing refused
    world = cfg.nproc * cfg.nnodes if cfg.multiprocess else launch_world()
    entry.check(cfg, world)  # a user error found here answers before torch is imported
    if not cfg.multiprocess:
        return entry.work(cfg, **kwargs)
    checked = entry.check_launch(cfg)  # nothing is created or written before these pass
    # Work already done (eval: its report there) starts no process. One node only: the launchers of the others
    # would wait at the rendezvous for this one.
    if cfg.nnodes == 1 and (done := entry.done(cfg, checked)) is not None:
        return done
    return launch(name, cfg, entry)


def launch(name: str, cfg: Any, entry: Entry) -> dict[str, Any]:
    """Run job `name` in cfg.nproc processes on this node (of cfg.nnodes); returns the summary of this node's
    first rank: rank 0's, or on another node the same run's, its node named ("node_rank"). On one
    node, the output folder's lock is taken first (across nodes rank 0 takes it, wherever torchrun placed it),
    then node 0 runs `entry.check_out(cfg)` (across nodes holding the lock while it runs). Raises a rank's user error as it raised it (rank 0's, else the
    first one's, when several did), PeerLost (exit code 75) when a rank stopped answering or was killed by a signal, Stopped on a
    second signal."""
    j = job(name)
    with contextlib.ExitStack() as stack:
        if cfg.nnodes == 1:  # one writer from the first byte
            stack.enter_context(folder_lock(cfg.out, j.command))
        if cfg.node_rank == 0:  # (several nodes: held while the check runs, which may write; rank 0 takes it then)
            with folder_lock(cfg.out, j.command) if cfg.nnodes > 1 else contextlib.nullcontext():
                entry.check_out(cfg)
        tmp = stack.enter_context(launch_folder())
        files = {**{key: tmp / name for key, name in FILES.items()}, SPARE_ENV: reserve(tmp)}
        spec = _prepare(tmp, cfg, [files[HANDED_ENV], files[READY_ENV]])
        # torch's agent keeps its workers' log folders in --log-dir (else a folder of its own in TMPDIR, never
        # removed): here they go with the launch's temporary folder.
        cmd = [sys.executable, "-m", "lcft.launch.agent", *_rendezvous_args(cfg), f"--nproc-per-node={cfg.nproc}",
               f"--max-restarts={cfg.max_restarts}", f"--shutdown-timeout={cfg.stop_grace}",
               f"--log-dir={tmp / 'logs'}", "-m", "lcft.launch", name, str(spec)]
        if cfg.nnodes > 1 and cfg.max_restarts > 0:  # the other nodes would restart and wait for this one's
            del files[HANDED_ENV]  # rendezvous: the group fails on every node alike, each printing its error
        env = _environment(cfg, {k: str(v) for k, v in files.items()})
        supervisor = Supervisor(cmd, env, files[FAILURE_FILE_ENV], files.get(HANDED_ENV), cfg.nproc,
                                elastic=cfg.max_restarts > 0, resume=j.resume, gathers=cfg.nnodes > 1,
                                ready=files[READY_ENV])
        rc = supervisor.run()
        # This node's first rank hands back its summary once the ranks ended their work together and agreed on how
        # (lcft/launch/__main__.py): a node without rank 0 hears it from its own workers, sharing no run folder.
        if (rc > 128 or rc == EXIT_LOST) and files[RESULT_FILE_ENV].is_file():
            rc = 0  # the agent caught a signal too (a scheduler's, to every process of the job), passed on, or lost
            # the rendezvous after its workers ended (the node hosting it gone first): they finished all the same
        # After the supervisor ended everything itself (a frozen or lost rank), its own SIGKILLs are no cause.
        ended_by_itself = rc != 0 and not supervisor.ended
        killed = killed_workers(files[FAILURES_ENV], cfg.node_rank, j.resume) if ended_by_itself else None
        # A rank that ended with an error of its own is the cause; the others then see it gone ("stopped
        # answering"), which is its consequence, not a lost rank.
        erred = rc != 0 and not supervisor.ended and _erred(files[FAILURES_ENV])
        lost = read_report(files[FAILURE_FILE_ENV]) if rc != 0 and not erred else None
        summary = json.loads(files[RESULT_FILE_ENV].read_text()) if rc == 0 else None  # (every worker exited 0)
    if supervisor.stop is not None and supervisor.ended and not supervisor.started:  # (it waited for other nodes)
        raise Stopped(f"stopped by {signal_name(supervisor.stop)} before the nodes gathered (no worker had "
                      f"started); {j.resume}", supervisor.stop)
    if supervisor.said is not None:  # the cause: the other ranks' failures, had they gone on, its consequences
        raise _raised(supervisor.said)
    if rc != 0 and not supervisor.ended and (error := _agent_ended(rc, supervisor, cfg, j.resume)):
        raise error
    # (a stop told to workers, their handler set, they took up: they saved, whatever failed after)
    if rc != 0 and supervisor.stop is not None and not supervisor.ended and not supervisor.told:
        raise Stopped(f"stopped by {signal_name(supervisor.stop)} while the workers were starting, "
                      f"before they saved; {j.resume}", supervisor.stop)
    if killed or lost:
        raise PeerLost(killed or lost)
    if rc != 0 and supervisor.heard is not None:  # (nothing printed it)
        raise _raised(supervisor.heard)
    if rc != 0:
        raise LcftError(f"{j.what} processes failed (torchrun exit code {rc}); the first error is printed above")
    return summary


def _prepare(tmp: Path, cfg: Any, folders: list[Path]) -> Path:
    """Write the workers' config into the launch's temporary folder and make its `folders`; the config's path."""
    try:
        for folder in folders:
            folder.mkdir()
        return save_resolved(tmp / "spec.toml", to_dict(cfg))
    except OSError as e:
        raise unwritable(tmp, e, "the workers' config could not be written") from None


def _agent_ended(rc: int, supervisor: Supervisor, cfg: Any, resume: str) -> LcftError | None:
    """The error when torchrun's agent ended on a signal or on a rendezvous another node closed, from its exit code
    (lcft/launch/agent.py; None when its workers ended it, or the launcher's stop signal killed it before its
    handler was set: the workers were starting). A signal it caught (128 + N) it passed on, and the workers ended
    before they finished: Stopped. One that killed it (-N; SIGKILL: the OOM killer) took the workers with it, and
    a rendezvous closed or gone (EXIT_LOST), or one that did not gather every node again for a restart
    (EXIT_NOT_GATHERED), leaves them no group to rejoin: a lost launch. Before any worker started, either is a user
    error: the nodes never met, and a requeue would wait the same way."""
    if rc == EXIT_LOST and not supervisor.started:  # never met: not a lost run that a requeue continues
        return LcftError(f"cannot host or reach the run's rendezvous at {cfg.rdzv_endpoint} (node {cfg.node_rank}): "
                         "its port in use by another program, or node 0 not started or not reachable at that address")
    if rc == EXIT_NOT_GATHERED and not supervisor.started:  # a node never came: a rerun waits for it again
        return LcftError(f"the run's rendezvous at {cfg.rdzv_endpoint} did not gather its {cfg.nnodes} nodes within "
                         f"{_join_s(cfg)} s (--collective-timeout; node {cfg.node_rank} waited): start every node, "
                         "with the same --nnodes, --rdzv-endpoint and --out (its rendezvous is named after it)")
    if rc == EXIT_NOT_GATHERED:
        return PeerLost(f"the run's rendezvous at {cfg.rdzv_endpoint} did not gather its {cfg.nnodes} nodes again "
                        f"within {_join_s(cfg)} s for a restart: a node is gone; node {cfg.node_rank}'s workers have "
                        f"no group to rejoin; {resume}")
    if rc == EXIT_LOST:
        return PeerLost(f"the run's rendezvous at {cfg.rdzv_endpoint} is closed or gone: another node gave up on the "
                        f"run (its --max-restarts spent), or node 0, which hosts it, ended; node {cfg.node_rank}'s "
                        f"workers have no group to rejoin; {resume}")
    n = rc - 128 if rc > 128 else -rc
    if n not in signal.valid_signals() or (rc < 0 and n == supervisor.stop):
        return None
    if rc > 0:
        return Stopped(f"stopped by {signal_name(n)}, which torchrun's agent got too and passed on, before the "
                       f"workers saved (the agent kills them --stop-grace {cfg.stop_grace} s after it); {resume}", n)
    return PeerLost(f"torchrun's agent on node {cfg.node_rank} (pid {supervisor.proc.pid}) was killed by "
                    f"{signal_name(n)}, and its workers with it; {resume}")


def _raised(handed: Handed) -> LcftError:
    """The user error a rank handed over, as the launch raises it: its message and its exit code."""
    error = LcftError(handed.message)
    error.exit_code = handed.exit_code
    return error


def _environment(cfg: Any, files: dict[str, str]) -> dict[str, str]:
    """The agent's and workers' environment: this launch's private files, the lock rank 0 re-enters."""
    env = dict(os.environ, **files)
    # The CPUs this process may use (its affinity, its cgroup's quota) shared among the workers unless the user
    # chose: N processes x all the machine's cores each would oversubscribe the CPUs they are granted.
    # (an OMP_NUM_THREADS left blank is unset: kept, each worker's libgomp would ignore it and take every CPU)
    env["OMP_NUM_THREADS"] = omp_threads() or str(max(1, usable_cpus() // cfg.nproc))
    env[NODE_RANK_ENV] = str(cfg.node_rank)
    env[PARENT_ENV] = str(os.getpid())  # the agent ends at once if this process is gone before it is running
    if cfg.nnodes == 1:  # launch() holds the lock
        env[HELD_LOCK_ENV] = f"{os.getpid()} {Path(cfg.out).resolve()}"
    # The workers' store is the agents' (torch's default): bound at a port of the OS's choice and held from before
    # the workers start, so no other program can take it (a store of rank 0's own binds a port an agent picked free
    # and let go: another launch on the machine may take it in between, EADDRINUSE); each group under a prefix of
    # its own, the rendezvous round lcft's agent hands its workers (agent._hand_round, mesh._round_store).
    # A store connection that failed is a Python error the worker (liveness.diagnose) or the agent names; torch also
    # logs it as a C++ warning with some twenty stack frames, in every process of a node whose store host ended.
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # (C++ errors are still printed)
    return env


def _erred(path: Path) -> bool:
    """True when the agent recorded a worker that exited by itself with an error (not lost: exit code 75)."""
    with contextlib.suppress(OSError, ValueError):
        return any(f.get("exitcode", 0) > 0 and f["exitcode"] != EXIT_LOST for f in json.loads(path.read_text()))
    return False


def _rendezvous_args(cfg: Any) -> list[str]:
    """torchrun's rendezvous flags: a private one on this machine, or c10d at node 0's endpoint."""
    if cfg.nnodes == 1:
        return ["--standalone"]
    # One id per run folder: every node of a run, and a rerun of it, meet under the same name.
    run_id = "lcft-" + hashlib.sha256(str(Path(cfg.out).resolve()).encode()).hexdigest()[:16]
    return ["--nnodes", str(cfg.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", cfg.rdzv_endpoint,
            "--rdzv-id", run_id, "--rdzv-conf", f"is_host={int(cfg.node_rank == 0)},join_timeout={_join_s(cfg)}"]


def _join_s(cfg: Any) -> int:
    """How long a node waits at the rendezvous for the others, at the start and for each restart: the collective
    timeout, which bounds every wait for the others (torch's join timeout: whole seconds, 600 by default)."""
    return max(1, math.ceil(cfg.collective_timeout))
