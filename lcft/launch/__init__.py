"""`--nproc N` (and `--nnodes`, `--max-restarts`) for `lcft train` and `lcft eval`: start the processes of a
run through torchrun's elastic agent (c10d rendezvous), gloo on CPU.

The parent writes the resolved config into the output folder, runs `python -m torch.distributed.run
--standalone|--rdzv-* --nproc-per-node N --max-restarts R -m lcft.launch JOB CONFIG.toml` (the worker entry is
lcft/launch/__main__.py), passes SIGTERM/SIGINT on to the workers (training ones finish the step, checkpoint
and exit), ends them at once on a second signal or when one of them is frozen, and returns the summary rank 0
wrote. Several nodes: the same command on every node with its own `--node-rank` and node 0's
`--rdzv-endpoint`. Inside a torchrun launch started by hand, `--nproc` and the launch options are ignored.

Exit codes of `lcft train` (what a scheduler sees): 0 the run finished (or --stop-after was reached);
1 a user error (fix the command; a rerun fails the same way); 128 + N stopped by signal N after saving a
checkpoint (143 SIGTERM, 130 SIGINT; or killed by it before saving); 75 a rank or node stopped answering or
died (no new checkpoint). After 143, 130 and 75, `--resume auto` continues from the latest verified checkpoint.

This module imports nothing from lcft.train or lcft.evaluate (they call it); only the worker entry does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from lcft.config import save_resolved, to_dict
from lcft.errors import LcftError
from lcft.launch.liveness import EXIT_LOST, FAILURE_FILE_ENV, NODE_RANK_ENV, PeerLost, read_report

__all__ = ["EXIT_LOST", "JOBS", "Job", "PeerLost", "Stopped", "exit_code", "launch", "launched"]


@dataclass(frozen=True)
class Job:
    """What the parent needs to know of one kind of launched work (the worker side is in __main__.py)."""

    summary: str
    """File rank 0 writes into cfg.out; the parent returns its content."""
    spec: str
    """The resolved config the workers read, written into cfg.out."""
    what: str
    """The work, for error messages ("training processes failed ...")."""
    keep_spec: bool
    """Leave the spec in cfg.out afterwards (a run folder keeps it; a report folder does not)."""


JOBS = {
    "train": Job(summary="summary.json", spec="launch.toml", what="training", keep_spec=True),
    "eval": Job(summary="eval.json", spec="eval-launch.toml", what="evaluation", keep_spec=False),
}


def launched() -> bool:
    """True inside a torchrun (or similar) launch: the process group is described by the environment."""
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


class Stopped(LcftError):
    """The workers were ended by a signal before they could save (a second signal); exit code 128 + signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


def exit_code(summary: dict[str, Any]) -> int:
    """The process exit code of a finished command from its summary: 128 + N when signal N stopped the run
    (after its checkpoint), else 0."""
    name = summary.get("signal")
    return 128 + int(signal.Signals[name]) if summary.get("stopped") == "signal" and name else 0


def launch(job: str, cfg: Any) -> dict[str, Any]:
    """Run `job` ("train" or "eval") with cfg in cfg.nproc processes on this node (of cfg.nnodes); returns
    rank 0's summary. Raises PeerLost (exit code 75) when a rank stopped answering, Stopped on a second signal."""
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r} (one of {', '.join(JOBS)})")
    j = JOBS[job]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    node0 = cfg.node_rank == 0
    spec = save_resolved(out / (j.spec if node0 else f"node{cfg.node_rank}-{j.spec}"), to_dict(cfg))
    summary = out / j.summary
    if node0:
        summary.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", *_rendezvous_args(cfg), f"--nproc-per-node={cfg.nproc}",
           f"--max-restarts={cfg.max_restarts}", "-m", "lcft.launch", job, str(spec)]
    env = dict(os.environ)
    # One thread per process unless the user chose: N processes x all cores each would oversubscribe the CPU.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.nproc)))
    env[NODE_RANK_ENV] = str(cfg.node_rank)
    # torchrun's agent otherwise keeps one store for every restart of the group, and a restarted rank can read
    # the address a dead one published (gloo: "connectFullMesh failed ... Connection refused"); a store per
    # round (served by rank 0) starts each restart clean.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    with tempfile.TemporaryDirectory(prefix="lcft-launch-") as tmp:
        failure = Path(tmp) / "failure.txt"
        env[FAILURE_FILE_ENV] = str(failure)
        try:
            rc = _Supervisor(cmd, env, failure, elastic=cfg.max_restarts > 0).run()
        finally:
            if not (j.keep_spec and node0):
                spec.unlink(missing_ok=True)
        lost = read_report(failure) if rc != 0 else None
    if lost:
        raise PeerLost(lost)
    if rc != 0:
        raise LcftError(f"{j.what} processes failed (torchrun exit code {rc}); the first error is printed above")
    if summary.is_file():
        return json.loads(summary.read_text())
    if not node0:  # rank 0 runs on node 0 and writes the summary there
        return {"run_dir": str(out), "node_rank": cfg.node_rank, "stopped": "done"}
    raise LcftError(f"{j.what} processes ended without writing {summary}")


def _rendezvous_args(cfg: Any) -> list[str]:
    """torchrun's rendezvous flags: a private one on this machine, or c10d at node 0's endpoint."""
    if cfg.nnodes == 1:
        return ["--standalone"]
    # One id per run folder: every node of a run, and a rerun of it, meet under the same name.
    run_id = "lcft-" + hashlib.sha256(str(Path(cfg.out).resolve()).encode()).hexdigest()[:16]
    return ["--nnodes", str(cfg.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", cfg.rdzv_endpoint,
            "--rdzv-id", run_id, "--rdzv-conf", f"is_host={int(cfg.node_rank == 0)}"]


class _Supervisor:
    """Runs torchrun in its own session and stands between it and the signals sent to this process.

    In its own session a Ctrl-C on the terminal reaches only this process, which signals the workers itself.
    Signalling torchrun instead would make it kill the workers (SIGKILL after 30 s), possibly in the middle of
    their final checkpoint. A second signal, or a frozen worker (which could never save), ends everything at
    once; so does a worker's diagnosis of a lost rank when no restart will follow (torchrun would otherwise
    wait 30 s for a frozen process it cannot stop with SIGTERM).
    """

    POLL_S = 0.2
    LOST_GRACE_S = 3.0  # after a worker reported a lost rank, let torchrun end the group by itself this long

    def __init__(self, cmd: list[str], env: dict[str, str], failure: Path, elastic: bool) -> None:
        self.cmd, self.env, self.failure, self.elastic = cmd, env, failure, elastic
        self.signals: list[int] = []
        self.killed_by: int | None = None

    def run(self) -> int:
        self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True)
        # signal.signal works only in the main thread; elsewhere the workers simply get no forwarded signals.
        main = threading.current_thread() is threading.main_thread()
        old = {s: signal.signal(s, lambda n, _f: self.signals.append(n)) for s in (signal.SIGTERM, signal.SIGINT)
               } if main else {}
        try:
            return self._wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _wait(self) -> int:
        reported_at: float | None = None
        forwarded = False
        while True:
            try:
                rc = self.proc.wait(timeout=self.POLL_S)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                if self.killed_by is not None:
                    raise Stopped(f"stopped by a second {signal.Signals(self.killed_by).name} before the workers "
                                  "saved; --resume auto continues from the latest checkpoint", self.killed_by)
                return rc
            while self.signals:
                signum = self.signals.pop(0)
                if forwarded:
                    print(f"second {signal.Signals(signum).name}: ending the workers now, without a checkpoint",
                          file=sys.stderr, flush=True)
                    self.killed_by = signum
                    self._kill()
                else:
                    forwarded = True
                    self._forward(signum)
            if read_report(self.failure) is not None:
                if self.elastic:  # the agent restarts the group: say why, and clear the way for the next report
                    print(f"restarting: {read_report(self.failure)}", file=sys.stderr, flush=True)
                    self.failure.unlink(missing_ok=True)
                elif reported_at is None:
                    reported_at = time.monotonic()
                elif time.monotonic() - reported_at > self.LOST_GRACE_S:
                    self._kill()

    def _workers(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            return psutil.Process(self.proc.pid).children(recursive=True)
        return []

    def _forward(self, signum: int) -> None:
        """Pass the signal to every worker, unless one is frozen: then nothing can be saved, end them all."""
        workers = self._workers()
        frozen = [w for w in workers if _status(w) == psutil.STATUS_STOPPED]
        if frozen:
            ranks = ", ".join(_describe(w) for w in frozen)
            if not self.failure.exists():  # a worker's own diagnosis comes first
                self.failure.write_text(f"{ranks} is stopped (frozen, e.g. SIGSTOP) and cannot save; ended on "
                                        f"{signal.Signals(signum).name} without a new checkpoint: start it again "
                                        "with --resume auto\n")
            self._kill()
            return
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.send_signal(signum)

    def _kill(self) -> None:
        """SIGKILL torchrun and its workers (each in a session of its own; a stopped process takes SIGKILL too)."""
        for p in [*self._workers(), psutil.Process(self.proc.pid)]:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _status(p: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        return p.status()
    return None


def _describe(p: psutil.Process) -> str:
    """'rank R on node N (pid P)' of a worker process, from the environment torchrun gave it."""
    with contextlib.suppress(psutil.Error):
        env = p.environ()
        if "RANK" in env:
            return f"rank {env['RANK']} on node {env.get(NODE_RANK_ENV, '0')} (pid {p.pid})"
    return f"pid {p.pid}"
