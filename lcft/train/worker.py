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
    return 0


if __name__ == "__main__":
    sys.exit(main())
