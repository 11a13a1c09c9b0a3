"""A long run keeps nothing from step to step: the live tensors and the objects of each kind before a late step are
those before an early one (a per-step leak, a loss or gradient norm kept with its graph, a list of metrics growing,
would end an 80-step run of 512K tokens on a GPU long before its end)."""

from __future__ import annotations

import gc
from collections import Counter

import torch

from lcft.train import TrainConfig, TrainHooks, train

EARLY, LATE = 5, 18  # after the warm-up and the first checkpoints and prunes; late enough to see growth per step


def _census() -> tuple[Counter, int, int]:
    """Live objects by type name, the number of live tensors and their bytes."""
    gc.collect()
    objects = gc.get_objects()
    # exact types: isinstance and issubclass would ask torch's ABC machinery, whose caches of the types asked
    # about grow (weak references) as types first seen later are asked about
    tensors = [o for o in objects if type(o) in (torch.Tensor, torch.nn.Parameter)]
    return Counter(type(o).__name__ for o in objects), len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def test_nothing_is_kept_from_step_to_step(tmp_path, base_cfg):
    """20 steps saving every 3 (keeping 2: saves and prunes among them), the census before step 5 and before step
    18: the same live tensors (count and bytes), and no kind of object more numerous by more than 8 (a save keeps
    a path or two: 4 saves in between; one object a step would be 13)."""
    seen: dict[int, tuple[Counter, int, int]] = {}

    def before_step(step: int) -> None:
        if step in (2, EARLY, LATE):  # step 2's is not compared: a first census makes what later ones find made
            seen[step] = _census()

    cfg = TrainConfig(out=str(tmp_path / "run"), **{**base_cfg, "steps": 20, "save_every": 3, "keep_last": 2})
    assert train(cfg, TrainHooks(before_step=before_step))["step"] == 20
    (kinds_early, n_early, bytes_early), (kinds_late, n_late, bytes_late) = seen[EARLY], seen[LATE]
    assert (n_late, bytes_late) == (n_early, bytes_early), ((n_early, bytes_early), (n_late, bytes_late))
    grown = {k: kinds_late[k] - kinds_early[k] for k in kinds_late if kinds_late[k] - kinds_early[k] > 8}
    assert not grown, grown
