"""Process-level memory settings for long windows (kept out of lcft/model, which never touches the process)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import torch

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
LONG_WINDOW = 1 << 16  # from this sequence length on, the setting below pays for itself


def return_freed_buffers_to_os(seq_len: int, threshold: int = 1 << 20) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for long windows.

    Why: block checkpointing with sequence chunks (lcft.model's seq_chunk) frees and re-allocates many
    tensors of a few MiB. glibc's threshold adapts upwards after such frees, so those buffers move to the heap,
    which fragments and never shrinks: measured at 64K tokens, 42.9 KiB/token of peak RSS instead of 17.8. A
    fixed threshold keeps them mmapped, so freed memory goes back to the OS. Short windows keep the default
    (more mmap calls would only cost time there). Returns True when the setting was applied.
    """
    if seq_len < LONG_WINDOW or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False


ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""Where a user sets the CUDA allocator: torch reads PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF, its older name."""


def expandable_cuda_segments(seq_len: int) -> bool:
    """CUDA's counterpart of the setting above: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for long windows.

    Why: the same frees and re-allocations of sequence-chunk buffers of varying sizes fragment the CUDA caching
    allocator's fixed segments; expandable segments grow in place, so freed memory is reused instead of
    reserved twice. Skipped when the user set expandable_segments in PYTORCH_ALLOC_CONF (or PYTORCH_CUDA_ALLOC_CONF)
    themselves, off CUDA and for short windows. Returns True when the setting was applied.
    """
    if seq_len < LONG_WINDOW or not torch.cuda.is_available():
        return False
    if any("expandable_segments" in os.environ.get(k, "") for k in ALLOC_CONF_VARS):
        return False  # the user's explicit choice wins
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return True
