"""`--nproc N`: start N local training processes through torchrun (torch.distributed.run), gloo on CPU.

The parent writes the resolved config to `<out>/launch.toml`, runs
`python -m torch.distributed.run --standalone --nproc-per-node N -m lcft.train.worker <out>/launch.toml`,
passes SIGTERM/SIGINT on to the workers (which finish the step, checkpoint and exit 0), and returns the summary
rank 0 wrote. Multi-node: start `torchrun` yourself on every node with its usual flags
(`--nnodes`, `--node-rank`, `--rdzv-endpoint` / `--master-addr`) and `-m lcft train ...`; inside a torchrun
launch `--nproc` is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from lcft.config import save_resolved, to_dict
from lcft.errors import LcftError
from lcft.train.config import TrainConfig

SUMMARY = "summary.json"
LAUNCH_CONFIG = "launch.toml"


def launched() -> bool:
    """True inside a torchrun (or similar) launch: the process group is described by the environment."""
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def launch(cfg: TrainConfig) -> dict[str, Any]:
    """Run the training in cfg.nproc local processes; returns rank 0's summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = save_resolved(out / LAUNCH_CONFIG, to_dict(cfg))
    (out / SUMMARY).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.nproc}",
           "-m", "lcft.train.worker", str(spec)]
    env = dict(os.environ)
    # One thread per process unless the user chose: N processes x all cores each would oversubscribe the CPU.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.nproc)))
    # torchrun runs in its own session: a Ctrl-C on the terminal reaches only this process, which passes
    # SIGINT/SIGTERM to the workers themselves. Signalling torchrun instead would make it kill the workers
    # (SIGKILL after 30 s), possibly in the middle of their final checkpoint.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum: int, _frame: Any) -> None:
        try:
            workers = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)} if _main_thread() else {}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    summary = out / SUMMARY
    if rc != 0:
        raise LcftError(f"training processes failed (torchrun exit code {rc}); the first error is printed above")
    if not summary.is_file():
        raise LcftError(f"training processes ended without writing {summary}")
    return json.loads(summary.read_text())


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
