"""The CPUs a process may use: its real affinity (a child pinned to one CPU), and cgroup v2 and v1 quotas read from
trees written here (nested limits, a container's own view, and files that are garbage, huge, missing or no file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lcft.cpus import READ_LIMIT, cgroup_cpus, omp_threads, usable_cpus
from tests.one_line import one_line
from tests.test_files import NON_FILES, plant

ROOT = Path(__file__).resolve().parents[1]
AFFINITY = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _tree(tmp_path: Path, listing: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup mount under tmp_path holding `files` (relative path -> text), and a /proc/self/cgroup listing."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "self_cgroup").write_text(listing)
    return root, tmp_path / "self_cgroup"


def _quota(tmp_path: Path, listing: str, files: dict[str, str]) -> int | None:
    root, listing_file = _tree(tmp_path, listing, files)
    got = cgroup_cpus(root, listing_file)
    assert usable_cpus(root, listing_file) == max(1, min(AFFINITY, got) if got is not None else AFFINITY)
    return got


@pytest.mark.skipif(AFFINITY < 2, reason="needs 2 CPUs to pin a process to one of them")
def test_a_process_pinned_to_one_cpu_may_use_one():
    """taskset or a Slurm cpuset: the affinity mask, not the machine's CPU count."""
    cpu = min(os.sched_getaffinity(0))
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}}); from lcft.cpus import usable_cpus; print(usable_cpus())"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert got.returncode == 0 and got.stdout == "1\n", got


@pytest.mark.parametrize(("cpu_max", "cpus"), [("150000 100000\n", 2), ("50000 100000", 1), ("1000 100000\n", 1),
                                               ("200000 100000\n", 2), ("max 100000\n", None)])
def test_cgroup_v2_cpu_max_is_rounded_up(tmp_path, cpu_max, cpus):
    """cpu.max "QUOTA PERIOD": ceil(quota / period) CPUs, at least 1; "max" is no limit."""
    assert _quota(tmp_path, "0::/job/step\n", {"job/step/cpu.max": cpu_max}) == cpus


@pytest.mark.parametrize(("parent", "child", "cpus"), [("100000 100000", "300000 100000", 1),
                                                       ("300000 100000", "100000 100000", 1),
                                                       ("250000 100000", "max 100000", 3)])
def test_cgroup_v2_limits_nest_and_the_smallest_wins(tmp_path, parent, child, cpus):
    assert _quota(tmp_path, "0::/job/step\n", {"job/cpu.max": parent, "job/step/cpu.max": child}) == cpus


def test_a_container_sees_its_own_cgroup_at_the_root(tmp_path):
    """A path of the host's names no folder under the container's mount: its root holds the container's quota."""
    assert _quota(tmp_path, "0::/docker/0123abcd\n", {"cpu.max": "50000 100000"}) == 1


@pytest.mark.parametrize("folder", ["cpu,cpuacct", "cpu"])
def test_cgroup_v1_cfs_quota(tmp_path, folder):
    """v1: cpu.cfs_quota_us / cpu.cfs_period_us of the cpu controller's hierarchy, nested like v2's; -1 is none."""
    listing = "12:memory:/slurm/job\n4:cpu,cpuacct:/slurm/job/step\n0::/\n"
    at = f"{folder}/slurm/job"
    files = {f"{at}/cpu.cfs_quota_us": "150000\n", f"{at}/cpu.cfs_period_us": "100000\n",
             f"{at}/step/cpu.cfs_quota_us": "-1\n", f"{at}/step/cpu.cfs_period_us": "100000\n"}
    assert _quota(tmp_path, listing, files) == 2
    assert _quota(tmp_path / "none", listing, {**files, f"{at}/cpu.cfs_quota_us": "-1\n"}) is None


@pytest.mark.parametrize("cpu_max", ["", "garbage", "150000", "150000 100000 7", "1.5 100000", "-100000 100000",
                                     "150000 0", "+150000 100000", "\uff11\uff15 100000", "0 100000",
                                     "9" * 25 + " 100000", "1" + "0" * READ_LIMIT + " 100000"])
def test_garbage_in_cpu_max_is_no_limit(tmp_path, cpu_max):
    assert _quota(tmp_path, "0::/\n", {"cpu.max": cpu_max}) is None


def test_a_huge_quota_leaves_the_affinity(tmp_path):
    assert _quota(tmp_path, "0::/\n", {"cpu.max": "9223372036854775807 1"}) == 9223372036854775807


@pytest.mark.parametrize("listing", ["", "garbage", "0::job/step\n", "0::/job/../../etc\n", "4:cpu\n",
                                     "4:cpuset:/job/step\n", "0::/job/\0/step\n"])
def test_an_odd_listing_of_cgroups_is_no_limit(tmp_path, listing):
    """Only an absolute path inside the mount is read; a path that climbs out of it is not followed."""
    files = {"job/step/cpu.max": "50000 100000", "cpu.max": "50000 100000", "cpuset/cpu.cfs_quota_us": "50000",
             "cpuset/cpu.cfs_period_us": "100000"}
    assert _quota(tmp_path / "tree", listing, files) is None


def test_without_affinity_the_machine_counts(tmp_path, monkeypatch):
    """macOS and Windows have no sched_getaffinity: all the machine's CPUs."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus(tmp_path, tmp_path / "no listing") == 64


def test_missing_files_are_no_limit(tmp_path):
    assert cgroup_cpus(tmp_path / "no mount", tmp_path / "no listing") is None
    assert usable_cpus(tmp_path / "no mount", tmp_path / "no listing") == AFFINITY
    assert _quota(tmp_path, "0::/job/step\n4:cpu:/job\n", {"cpu/job/cpu.cfs_quota_us": "50000"}) is None  # no period


@pytest.mark.parametrize("kind", NON_FILES)
@pytest.mark.parametrize("which", ["listing", "cpu.max"])
def test_what_is_no_file_is_no_limit_and_never_read(tmp_path, kind, which):
    """A FIFO is not waited on, a link to /dev/zero not read on and on."""
    root, listing = _tree(tmp_path, "0::/\n", {"cpu.max": "50000 100000"})
    plant(listing if which == "listing" else root / "cpu.max", kind)
    assert cgroup_cpus(root, listing) is None and usable_cpus(root, listing) == AFFINITY


def test_text_that_is_not_utf8_is_no_limit(tmp_path):
    root, listing = _tree(tmp_path, "0::/\n", {"cpu.max": "50000 100000"})
    listing.write_bytes(b"0::/\xff\n")
    assert cgroup_cpus(root, listing) is None


@pytest.mark.parametrize("given, kept", [("4", "4"), ("4,2", "4,2"), (" 8 ", " 8 "), ("", None), ("  ", None)])
def test_a_thread_count_libgomp_reads_is_kept_and_a_blank_one_is_unset(monkeypatch, given, kept):
    monkeypatch.setenv("OMP_NUM_THREADS", given)
    assert omp_threads() == kept


@pytest.mark.parametrize("given", ["abc", "0", "-3", "2.5", "4,", "4,0"])
def test_a_thread_count_libgomp_would_ignore_is_one_line(monkeypatch, given):
    """libgomp warns on these, ignores them and takes every CPU."""
    monkeypatch.setenv("OMP_NUM_THREADS", given)
    one_line(omp_threads, f"OMP_NUM_THREADS={given!r}", "unset it")
