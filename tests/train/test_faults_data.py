"""The prepared windows changed under a running `lcft train`: one error line, exit 1 (the windows were memory
mapped, and a file cut short stopped the run with SIGBUS, exit 135 and no message)."""

from __future__ import annotations

import os
import shutil

from .launching import error_lines, start_train, wait_for_step


def test_windows_cut_short_under_a_running_train_stop_it_in_one_line(tmp_path, data_dir, init_dir):
    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(data_dir, data)
    proc = start_train(data, init_dir, run, "--steps", "100000", "--save-every", "0")
    try:
        wait_for_step(run, 1, [proc])
        os.truncate(data / "train.bin", 100_000)  # 48 of its windows left: the seeded order soon asks for another
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    [line] = error_lines(err)
    assert f"{data / 'train.bin'} changed since it was checked" in line and "now 100,000 bytes" in line, line
