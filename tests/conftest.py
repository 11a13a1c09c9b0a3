"""Shared fixtures: each test starts with fp32 defaults and no process group left over."""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

import psutil
import pytest
import torch

SHARED_GENOMES = Path(__file__).resolve().parents[2] / "shared" / "genomes"
SHARED_PUBLISHED = SHARED_GENOMES.parent / "published"  # genome models' files as published
# The modules of a minute or more on 2 CPU cores, longest first (test_real_run on an AMD EPYC: 383 s in a full run
# with 8K windows; with 4K, 95 s alone, 164 s alone with 8K): collected
# first, so that workers (handed modules in collection order: the Makefile's --no-loadscope-reorder) start them
# at once and share the short rest at the end. Handed out last, test_real_run ran alone for 4 of 13 minutes.
FIRST = ("tests/train/test_real_run.py", "tests/test_gpu_check.py", "tests/train/test_elastic.py",
         "tests/launch/test_faults.py", "tests/train/test_compile.py", "tests/parallel/test_fsdp.py")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """One intra-op thread per process, in every module from the first test of the worker on: pytest-xdist runs
    one worker per core, so a second thread only oversubscribes them (an in-process eval of 200 windows: ~5 s of
    CPU on one thread, 25-29 s on two). Subprocesses inherit OMP_NUM_THREADS."""
    old_threads, old_env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(old_threads)
    if old_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = old_env


# torch's own default for inductor's compile cache (torch._inductor.runtime.cache_dir_utils, whose import takes a
# second): kept for every test and what it launches, so a temporary folder per test leaves the cache warm.
INDUCTOR_CACHE = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")


@pytest.fixture(autouse=True)
def _own_temporary_folder(tmp_path_factory, monkeypatch):
    """TMPDIR of this test's own (under pytest's base folder, which keeps only its latest runs), for the processes it
    starts and this one's tempfile: a launcher a test kills leaves its temporary folder there, not in /tmp."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", INDUCTOR_CACHE))
    tmp = str(tmp_path_factory.mktemp("tmp"))
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setattr(tempfile, "tempdir", tmp)  # (cached by tempfile.gettempdir at its first call)


@pytest.fixture(autouse=True)
def _reset_torch_state():
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(torch.float32)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _kept(p: psutil.Process) -> bool:
    """A helper process that outlives one test by design: multiprocessing's resource tracker or forkserver,
    inductor's compile workers (each started once, on first use)."""
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return True
    return "multiprocessing." in cmd or "torch._inductor" in cmd


@pytest.fixture(autouse=True)
def _no_process_left():
    """Ends what a test left running under this process: a launcher whose test failed or timed out midway keeps
    its workers training, and they slow every later test of the run."""
    yield
    left = [p for p in psutil.Process().children(recursive=True) if not _kept(p)]
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)


@pytest.fixture
def genomes_dir() -> Path:
    """The real genome samples in ../shared/genomes (see its README.txt)."""
    if not SHARED_GENOMES.is_dir():
        pytest.skip(f"shared genome samples not found at {SHARED_GENOMES}")
    return SHARED_GENOMES


def pytest_collection_modifyitems(config, items):
    first = {module: i for i, module in enumerate(FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(FIRST)))  # stable: the rest keep order
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
