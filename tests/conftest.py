"""Shared fixtures: each test starts with fp32 defaults and no process group left over."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_GENOMES = Path(__file__).resolve().parents[2] / "shared" / "genomes"


@pytest.fixture(autouse=True)
def _reset_torch_state():
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(torch.float32)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def genomes_dir() -> Path:
    """The real genome samples in ../shared/genomes (see its README.txt)."""
    if not SHARED_GENOMES.is_dir():
        pytest.skip(f"shared genome samples not found at {SHARED_GENOMES}")
    return SHARED_GENOMES


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
