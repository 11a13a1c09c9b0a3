"""Eval batches reach the device in the windows' narrow ids and are widened there, with the losses of int64 ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lcft.evaluate import EvalConfig, evaluate
from lcft.evaluate import losses as L


def _int64_batch(windows: list[np.ndarray]) -> torch.Tensor:
    """The batch as eval stacked it before: int64 on the host."""
    return torch.from_numpy(np.stack(windows).astype(np.int64))


@pytest.mark.parametrize(("stored", "host"), [(np.uint8, torch.uint8), (np.uint16, torch.int32)])
def test_window_losses_take_narrow_batches_and_match_int64_ids(data_dir, ckpt_a, monkeypatch, stored, host):
    """uint8 (char files) stays uint8 on the host, uint16 (a larger vocabulary's files) becomes int32 (torch's
    uint16 has few device kernels); either way every loss and counted flag equals the int64 batch's bit for bit."""
    from lcft.checkpoint.hf_folder import from_pretrained
    from lcft.genomics import open_windows

    ws, model = open_windows(data_dir, "eval"), from_pretrained(ckpt_a).eval()
    n, cfg = 5, EvalConfig(data=str(data_dir), checkpoints=(str(ckpt_a),), batch_size=2)
    seen, real = [], L.token_losses

    def spy(model, ids, **kw):
        seen.append(ids.dtype)
        return real(model, ids, **kw)

    monkeypatch.setattr(L, "token_losses", spy)
    for max_context in (0, 512):
        got = list(L.window_losses(model, n, lambda i: np.asarray(ws[i]).astype(stored), cfg, max_context,
                                   torch.device("cpu")))
        assert [i for i, _, _ in got] == list(range(n))
        for first in range(0, n, cfg.batch_size):  # the oracle: the same batches as int64, as eval ran them
            batch = list(range(first, min(first + cfg.batch_size, n)))
            want, counted = real(model, _int64_batch([np.asarray(ws[i]) for i in batch]), max_context=max_context)
            for j, i in enumerate(batch):
                assert np.array_equal(got[i][1], want[j].numpy()) and np.array_equal(got[i][2], counted[j].numpy())
                assert got[i][2].sum() > 0
    assert seen and set(seen) == {host}


def test_eval_report_is_the_same_as_with_int64_batches(data_dir, ckpt_a, ckpt_b, tmp_path, monkeypatch):
    """A whole eval (two checkpoints, a --max-context control, the copy probe) writes the same figures as with
    the int64 host batches it stacked before."""
    def run(out: str) -> dict:
        rep = json.loads(json.dumps(evaluate(EvalConfig(
            data=str(data_dir), checkpoints=(str(ckpt_a), str(ckpt_b)), out=str(tmp_path / out), max_windows=3,
            batch_size=2, max_context=(0, 512), bins=4, bootstrap=20, probe="copy", probe_windows=1,
            probe_segment=256))))
        return {k: v for k, v in rep.items() if k not in ("created", "options")}  # the run's date and --out

    narrow = run("narrow")
    monkeypatch.setattr(L, "host_batch", _int64_batch)
    assert run("int64") == narrow
