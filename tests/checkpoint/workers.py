"""Functions run on each spawned rank by the checkpoint tests (module-level so spawn can pickle them)."""

from __future__ import annotations

import errno
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemWriter

from lcft.model import Llama
from tests.train.conftest import small_model_config


def save_with_full_disk(rank: int, world: int, run_dir: str) -> dict:
    """Step 1 saved through DCP on every rank, then step 2 with rank 1's shard write failing as a full disk
    fails (ENOSPC); returns this rank's error type and text."""
    from lcft.checkpoint.sharded import save_sharded
    from lcft.errors import LcftError

    torch.manual_seed(0)
    model = Llama(small_model_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    save_sharded(Path(run_dir), 1, model, opt, rank == 0, lambda tmp: None, None)
    real = FileSystemWriter.write_data

    def full(self, plan, planner):
        if rank == 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(self.path) / "__1_0.distcp"))
        return real(self, plan, planner)

    FileSystemWriter.write_data = full
    try:
        save_sharded(Path(run_dir), 2, model, opt, rank == 0, lambda tmp: None, None)
    except LcftError as e:
        return {"type": "LcftError", "msg": str(e)}
    except BaseException as e:  # noqa: BLE001 what the test reports: anything but the one-line error
        return {"type": type(e).__name__, "msg": str(e)[:2000]}
    return {"type": None, "msg": ""}
