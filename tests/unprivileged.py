"""Processes without root's override of file modes: a read-only folder refuses them as it refuses an ordinary user."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

# The capabilities that let root write, search and chmod whatever a folder's mode: CAP_DAC_OVERRIDE (1),
# CAP_DAC_READ_SEARCH (2), CAP_FOWNER (3).
MODE_OVERRIDES = (1, 2, 3)
CAPABILITY_VERSION_3 = 0x20080522
PR_CAPBSET_DROP = 24


def drop_mode_overrides() -> None:
    """Take MODE_OVERRIDES from this process and from what it execs (capset and prctl, through libc: the standard
    library has neither). The bounding set too: root's exec grants every capability the bounding set holds."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in MODE_OVERRIDES:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)  # (version, pid 0: this process)
    sets = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) of capabilities 0-31, then of 32-63
    if libc.capget(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    mask = sum(1 << cap for cap in MODE_OVERRIDES)
    for i in range(3):
        sets[i] &= ~mask
    if libc.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def unprivileged(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`args` run where folder modes apply (in `env`, else this process's environment): as root without
    MODE_OVERRIDES (skipped where they cannot be dropped), else as is."""
    if os.geteuid() != 0:
        return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env,
                              preexec_fn=drop_mode_overrides)
    except subprocess.SubprocessError as e:  # the child's OSError from drop_mode_overrides, before its exec
        pytest.skip(f"cannot drop root's override of folder modes here ({e})")
