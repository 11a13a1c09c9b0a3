"""The weight files of a checkpoint folder, plain safetensors or DCP shards: their sha256 (eval's report) and a cheap
check that every one of them opens, before any evaluation runs."""

from __future__ import annotations

from pathlib import Path

from lcft.checkpoint.model_files import is_sharded_checkpoint
from lcft.errors import LcftError, reason
from lcft.hashing import file_hash, files_sha256
from lcft.model.weight_files import header_dtypes, safe_opened, weight_files


def weights_sha256(ckpt: Path) -> str:
    """sha256 over the checkpoint's weight files in name order (one file: the plain sha256 of that file; a
    sharded checkpoint: over the files of its dcp/ folder)."""
    if is_sharded_checkpoint(ckpt):
        from lcft.checkpoint.dcp import sharded_weights_sha256  # (torch.distributed: sharded only)

        return sharded_weights_sha256(ckpt)
    files = _weight_files(ckpt)
    if len(files) == 1:
        return file_hash(files[0]).hexdigest()
    return files_sha256(files)


def check_weights_readable(ckpt: Path) -> None:
    """Open the header of every weights file (cheap: no tensor is read), so a truncated or foreign file is
    reported before any evaluation runs rather than after the checkpoints listed before it."""
    if is_sharded_checkpoint(ckpt):
        from lcft.checkpoint.dcp import check_sharded_readable  # (torch.distributed: sharded only)

        check_sharded_readable(ckpt)
        return
    for f in _weight_files(ckpt):
        header_dtypes(f)  # before safetensors reads the header: the one check of its dtypes
        try:
            with safe_opened(f) as sf:
                sf.keys()
        except Exception as e:  # SafetensorError is not exported under a stable name
            raise LcftError(f"unreadable checkpoint {ckpt}: {f.name}: {reason(e)}") from None


def _weight_files(ckpt: Path) -> list[Path]:
    """The files a load reads (model.safetensors, or the shards its index names), not whatever else ends in
    .safetensors there (a FIFO would block the check)."""
    try:
        return weight_files(ckpt)
    except LcftError as e:
        raise LcftError(f"unreadable checkpoint {e}") from None  # e names the folder first
