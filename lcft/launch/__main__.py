"""Worker entry of `--nproc N`: `python -m lcft.launch JOB CONFIG.toml`, started once per rank by torchrun."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from lcft.errors import LcftError
from lcft.launch import JOBS, liveness

Entry = tuple[Callable[[str], Any], Callable[[Any], Any]]  # (config loader, the work)


def _train_entry() -> Entry:
    from lcft.runs import latest_checkpoint
    from lcft.train.config import load_run_config
    from lcft.train.trainer import train

    def load(path: str) -> Any:
        cfg = load_run_config(path)
        # An elastic restart (the agent restarted the group after a process died) continues the run from its
        # latest verified checkpoint, whatever the first start was told.
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and latest_checkpoint(cfg.out) is not None:
            cfg = dataclasses.replace(cfg, resume="auto")
        return cfg

    return load, train


def _eval_entry() -> Entry:
    from lcft.config import build, load_toml
    from lcft.evaluate.config import EvalConfig
    from lcft.evaluate.runner import evaluate

    return (lambda path: build(EvalConfig, load_toml(path))), evaluate


# job -> its entry; imported only when the job runs, so the launcher stays below train and evaluate.
ENTRIES: dict[str, Callable[[], Entry]] = {"train": _train_entry, "eval": _eval_entry}


def main(argv: list[str] | None = None) -> int:
    """Load JOB's config from CONFIG.toml and run it on this rank; 1 on a user error (printed by rank 0)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ENTRIES:
        print(f"usage: python -m lcft.launch {{{','.join(JOBS)}}} CONFIG.toml "
              "(started by `lcft train|eval --nproc N`)", file=sys.stderr)
        return 2
    job, spec = args
    try:
        load, run = ENTRIES[job]()
        run(load(spec))
    except LcftError as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:
        # A collective that failed or timed out because another rank stopped: name it instead of a traceback.
        lost = liveness.diagnose(e)
        if lost is None:
            raise
        liveness.report(*lost)
        return liveness.EXIT_LOST
    finally:
        liveness.stop()
        _destroy_process_group()
    return 0


def _destroy_process_group() -> None:
    """Tear the process group down while the interpreter is still whole, after success and after an error.
    Left to interpreter shutdown, gloo's worker threads can still hold tensors whose release needs the GIL,
    and the process dies with SIGABRT ("terminate called without an active exception"), seen in CI,
    pytorch#190489."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
