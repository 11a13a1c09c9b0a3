"""`--nproc N` for `lcft train` and `lcft eval`: start N local processes through torchrun, gloo on CPU.

The parent writes the resolved config into the output folder, runs
`python -m torch.distributed.run --standalone --nproc-per-node N -m lcft.launch JOB CONFIG.toml` (the worker
entry is lcft/launch/__main__.py), passes SIGTERM/SIGINT on to the workers (training ones finish the step,
checkpoint and exit 0), and returns the summary rank 0 wrote. Multi-node: start `torchrun` yourself on every
node with its usual flags (`--nnodes`, `--node-rank`, `--rdzv-endpoint` / `--master-addr`) and
`-m lcft train ...`; inside a torchrun launch `--nproc` is ignored.

This module imports nothing from lcft.train or lcft.evaluate (they call it); only the worker entry does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from lcft.config import save_resolved, to_dict
from lcft.errors import LcftError


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


def launch(job: str, cfg: Any) -> dict[str, Any]:
    """Run `job` ("train" or "eval") with cfg in cfg.nproc local processes; returns rank 0's summary."""
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r} (one of {', '.join(JOBS)})")
    j = JOBS[job]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = save_resolved(out / j.spec, to_dict(cfg))
    summary = out / j.summary
    summary.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.nproc}",
           "-m", "lcft.launch", job, str(spec)]
    env = dict(os.environ)
    # One thread per process unless the user chose: N processes x all cores each would oversubscribe the CPU.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.nproc)))
    try:
        rc = _run_forwarding_signals(cmd, env)
    finally:
        if not j.keep_spec:
            spec.unlink(missing_ok=True)
    if rc != 0:
        raise LcftError(f"{j.what} processes failed (torchrun exit code {rc}); the first error is printed above")
    if not summary.is_file():
        raise LcftError(f"{j.what} processes ended without writing {summary}")
    return json.loads(summary.read_text())


def _run_forwarding_signals(cmd: list[str], env: dict[str, str]) -> int:
    """Run torchrun in its own session and pass SIGTERM/SIGINT to its workers; returns its exit code.

    In its own session a Ctrl-C on the terminal reaches only this process, which signals the workers itself.
    Signalling torchrun instead would make it kill the workers (SIGKILL after 30 s), possibly in the middle
    of their final checkpoint.
    """
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum: int, _frame: Any) -> None:
        try:
            workers = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.send_signal(signum)

    # signal.signal works only in the main thread; elsewhere the workers simply get no forwarded signals.
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
