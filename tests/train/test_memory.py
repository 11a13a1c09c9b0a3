"""The long-window malloc setting: applied only for long windows, on glibc, and harmless to call twice."""

import sys

import pytest

from lcft.train.memory import LONG_WINDOW, return_freed_buffers_to_os


def test_short_windows_keep_the_default():
    assert return_freed_buffers_to_os(LONG_WINDOW - 1) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_long_windows_set_the_threshold_in_a_child_process(tmp_path):
    import subprocess

    code = ("from lcft.train.memory import return_freed_buffers_to_os as f; "
            "print(f(1 << 20), f(1 << 20))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_cuda_allocator_setting_only_for_long_windows_on_cuda():
    import torch

    from lcft.train.memory import expandable_cuda_segments

    assert expandable_cuda_segments(LONG_WINDOW - 1) is False
    assert expandable_cuda_segments(LONG_WINDOW) is torch.cuda.is_available()
