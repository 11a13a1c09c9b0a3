"""Worker entry of `--nproc N`: `python -m lcft.train.worker CONFIG.toml`, started once per rank by torchrun."""

from __future__ import annotations

import os
import sys

from lcft.errors import LcftError
from lcft.train.config import load_run_config
from lcft.train.trainer import train


def main(argv: list[str] | None = None) -> int:
    """Worker entry: `python -m lcft.train.worker CONFIG.toml` (under torchrun)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lcft.train.worker CONFIG.toml (started by `lcft train --nproc N`)", file=sys.stderr)
        return 2
    try:
        train(load_run_config(args[0]))
    except LcftError as e:
        rank = os.environ.get("RANK", "0")
        if rank == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        _destroy_process_group()
    return 0


def _destroy_process_group() -> None:
    """Tear the process group down while the interpreter is still whole. Left to interpreter shutdown, gloo's
    worker threads can still hold tensors whose release needs the GIL, and the process dies with SIGABRT
    ("terminate called without an active exception") after a successful run (seen in CI, pytorch#190489)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
