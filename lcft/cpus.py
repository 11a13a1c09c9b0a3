"""The CPUs this process may use: its affinity mask, capped by the CPU quota of its cgroup (v2 cpu.max, v1 CFS)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from lcft.errors import LcftError, printable
from lcft.files import read_text

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
# Every file read here is one short line (cpu.max, cfs_quota_us) or a few lines of controllers and paths
# (/proc/self/cgroup); more than this is not such a file.
READ_LIMIT = 8 << 10
MAX_DIGITS = 19  # the kernel's quotas and periods are 64-bit microseconds
OMP_THREADS = re.compile(r" *0*[1-9][0-9]{0,8} *(, *0*[1-9][0-9]{0,8} *)*")  # libgomp's: counts >= 1, one per level


def usable_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int:
    """The CPUs this process may use, at least 1: those its affinity allows (a Slurm or taskset cpuset; all of
    os.cpu_count() where the OS has no affinity), fewer where its cgroup's CPU quota (the smallest along its path
    to the root, rounded up) grants fewer. `root` is where the cgroup hierarchies are mounted, `self_cgroup` the
    listing of this process's cgroups. An estimate for a thread count: what cannot be read is no limit."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this OS (macOS, Windows)
        allowed = os.cpu_count() or 1
    quota = cgroup_cpus(root, self_cgroup)
    return max(1, min(allowed, quota) if quota is not None else allowed)


def omp_threads() -> str | None:
    """OMP_NUM_THREADS as the user gave it; None when unset or blank (a job script's `export OMP_NUM_THREADS=$X`
    of an unset X). One libgomp would not read ('abc', '0') is an LcftError: libgomp warns, ignores it and takes
    every CPU, in each process of a launch."""
    given = os.environ.get("OMP_NUM_THREADS")
    if given is None or not given.strip():
        return None
    if not OMP_THREADS.fullmatch(given):
        raise LcftError(f"OMP_NUM_THREADS={printable(given)!r} in the environment is not a number of threads: set "
                        "a whole number of at least 1, or unset it")
    return given


def cgroup_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int | None:
    """CPUs the cgroup quotas of this process grant (ceil(quota / period), the smallest of those set on its
    cgroup and each one above it, v2 and v1 alike); None where none is set or none can be read."""
    listing = _read(self_cgroup)
    if listing is None:
        return None
    limits: list[int] = []
    for line in listing.splitlines():  # "ID:CONTROLLERS:PATH"; v2's unified hierarchy is "0::PATH"
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            limits += _along(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            # v1 mounts the controller at a folder named as listed ("cpu,cpuacct") or by itself ("cpu")
            for folder in dict.fromkeys((controllers, "cpu")):
                limits += _along(root / folder, path, _v1_quota)
    return min(limits, default=None)


def _along(top: Path, path: str, quota: Callable[[Path], int | None]) -> list[int]:
    """The quotas set on the cgroup at `path` under the mount `top` and on each cgroup above it, up to `top`.
    A path of the host's (a container that sees its own cgroup at the mount's root) names no folder here: the
    walk up still reaches the mount's root, which is the container's."""
    if not path.startswith("/"):
        return []
    parts = PurePosixPath(path).parts[1:]
    if any(p in (".", "..") or "\0" in p for p in parts):
        return []  # not a path inside the hierarchy
    found = (quota(top.joinpath(*parts[:depth])) for depth in range(len(parts), -1, -1))
    return [n for n in found if n is not None]


def _v2_quota(folder: Path) -> int | None:
    """cpu.max's "QUOTA PERIOD" in CPUs; None for "max PERIOD" (no limit) or anything else."""
    text = _read(folder / "cpu.max")
    fields = text.split() if text is not None else []
    return _cpus(fields[0], fields[1]) if len(fields) == 2 else None


def _v1_quota(folder: Path) -> int | None:
    """cpu.cfs_quota_us / cpu.cfs_period_us in CPUs; None for a quota of -1 (no limit) or anything unreadable."""
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    return _cpus(quota.strip(), period.strip()) if quota is not None and period is not None else None


def _cpus(quota: str, period: str) -> int | None:
    """ceil(quota / period), at least 1, of two decimal counts of microseconds; None unless both are positive."""
    if not all(s.isascii() and s.isdigit() and len(s) <= MAX_DIGITS for s in (quota, period)):
        return None  # "max", -1, signs, digits other than ASCII's, more than the kernel's 64 bits hold
    q, p = int(quota), int(period)
    return max(1, -(-q // p)) if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    """The text of a regular file of at most READ_LIMIT bytes; None for anything else (missing, a FIFO, a folder,
    too long, not UTF-8, a name the OS refuses)."""
    try:
        text = read_text(path, READ_LIMIT)
    except (LcftError, ValueError):  # ValueError: a NUL in the name
        return None
    return text if len(text.encode()) <= READ_LIMIT else None  # /proc and cgroup files report a size of 0
