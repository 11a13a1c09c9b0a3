"""Peak memory in metrics is the process's own: a run started from a large parent does not report the parent's."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lcft.train.metrics import peak_memory_bytes

PARENT_BYTES = 1 << 30

CHILD = """
import resource, subprocess, sys
big = bytearray({n})
for i in range(0, len(big), 4096):
    big[i] = 1  # make the parent's resident set large
code = "import torch; from lcft.train.metrics import peak_memory_bytes; print(peak_memory_bytes(torch.device('cpu')))"
out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
print(out.strip(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc accounting")
def test_a_child_of_a_large_process_reports_its_own_peak():
    out = subprocess.run([sys.executable, "-c", CHILD.format(n=PARENT_BYTES)], capture_output=True, text=True,
                         check=True).stdout.split()
    child_peak, parent_peak = int(out[0]), int(out[1])
    assert parent_peak > PARENT_BYTES  # the parent did hold the memory
    assert child_peak < PARENT_BYTES * 0.75, (child_peak, parent_peak)  # a fresh process with torch: ~0.3 GB


def test_peak_is_at_least_the_current_resident_set():
    import psutil

    assert peak_memory_bytes(torch.device("cpu")) >= psutil.Process().memory_info().rss * 0.99
