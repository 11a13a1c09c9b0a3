"""What `lcft eval` is given, checked before torch is imported: the launch's sizes, the data folder and its split,
the checkpoints named and the report's folder (lcft.launch runs `check_inputs` before it imports the evaluator;
`evaluate` makes each of these checks again itself)."""

from __future__ import annotations

from pathlib import Path

from lcft.checkpoint.layout import check_output_folder, locate_local, refuse_out_inside
from lcft.errors import LcftError
from lcft.evaluate.config import EvalConfig
from lcft.genomics.shards import read_manifest, verify_windows
from lcft.genomics.window_set import WindowSet, open_windows
from lcft.shapes import check_world


def check_inputs(cfg: EvalConfig, world: int) -> None:
    """What needs neither torch nor a full read of any file, for a world of `world` processes: it splits into
    context-parallel groups, --data holds a prepared manifest, every --checkpoint is found, --out may take the
    report."""
    check_world(world, cfg.cp)
    read_manifest(cfg.data)  # as every command reads --data (open_split checks its files against it)
    check_checkpoints(cfg)


def open_split(cfg: EvalConfig) -> WindowSet:
    """The split's WindowSet, limited to --max-windows, its files checked against the manifest first (unless
    --no-verify-data); an empty split is an error."""
    data = Path(cfg.data)
    if cfg.verify_data:
        verify_windows(data, (cfg.split,))  # names the corrupt file; a flipped byte is not evaluated silently
    ws = open_windows(data, cfg.split)
    if len(ws) == 0:
        raise LcftError(f"split {cfg.split!r} of {data} has no windows: nothing to evaluate")
    return ws


def check_checkpoints(cfg: EvalConfig) -> None:
    """Every checkpoint named is found (a Hub id is looked up when it is read), --out is none of them nor inside
    one, and may take the report (beside a run is fine). Nothing is hashed or read."""
    for given in cfg.checkpoints:  # named first (check_output_folder calls it a model folder)
        if (found := locate_local(given)) is not None:  # a Hub snapshot is looked up once, when it is read
            refuse_out_inside(cfg.out, found, "the report")
    check_output_folder(cfg.out, "the report", ("run",), data=cfg.data)
