"""The demo's positive control: train-split windows whose second half copies their first, written as a FASTA
and prepared, to train a model that does read its context back (what the copy probe and its interval must see)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lcft.config import format_size
from lcft.files import atomic_open

RECORD = "chr2copies"
"""The FASTA record of the planted windows: the train piece with a copy planted in every window."""


def plant_copies(seq: bytes, length: int) -> bytes:
    """`seq` with the second half of every whole `length`-base chunk overwritten by its first half: each
    window `lcft prepare windows --length length` cuts from it holds a real segment again `length / 2` bases
    later. Case is kept: a copied soft-masked base stays lower case."""
    if length < 2 or length % 2:
        raise ValueError(f"need an even length >= 2, got {length}")
    out = bytearray(seq)
    half = length // 2
    for start in range(0, len(seq) - length + 1, length):
        out[start + half:start + length] = out[start:start + half]
    return bytes(out)


def write_copies_fasta(fasta: Path, record: str, out: Path, length: int) -> Path:
    """A one-record FASTA (RECORD) at `out`: record `record` of `fasta` with copies planted (plant_copies),
    aligned to the windows `lcft prepare windows --length length` cuts from it (they start at 0, length, ...)."""
    from lcft.genomics.fasta import FastaFile

    with FastaFile(str(fasta)) as fa:
        raw = fa.read_raw(record, 0, fa.index[record].rlen)
    seq = plant_copies(raw.replace(b"\n", b"").replace(b"\r", b""), length)
    with atomic_open(out, "wb") as fh:
        fh.write(f">{RECORD}\n".encode("ascii"))
        for i in range(0, len(seq), 80):
            fh.write(seq[i:i + 80] + b"\n")
    return out


def copies_stage(cfg: Any, folder: Path) -> str:
    """Windows of cfg.control_context tokens from the chr2 piece with a copy planted in each (train split
    only: nothing held out is trained on), prepared into `folder`."""
    from lcft.genomics import sample_fasta
    from lcft.recipes import prepare_demo_windows

    fasta = folder.parent / f"{RECORD}-{cfg.control_context}.fa"  # copies planted for windows of this length
    if not fasta.is_file():
        write_copies_fasta(sample_fasta(), "chr2", fasta, int(cfg.control_context))
    m = prepare_demo_windows(fasta=str(fasta), out=str(folder), length=cfg.control_context, train=(RECORD,),
                             eval=())
    return (f"{m['splits']['train'].get('windows', '?')} chr2 windows of {format_size(cfg.control_context)}, "
            "the second half of each a copy of its first")


def control_train_config(cfg: Any, common: dict[str, Any], data: Path, out: Path, base_checkpoint: Path) -> Any:
    """The positive control's run: the base continued with dense attention on the planted windows, as many
    tokens a step as the base run, at a constant learning rate after the warm-up (a decaying one slows the
    step at which the model starts to read the copy back)."""
    from lcft.train import TrainConfig

    batch = max(1, cfg.base_batch * cfg.base_context // cfg.control_context)
    return TrainConfig(**{**common, "data": str(data)}, out=str(out), init=str(base_checkpoint), attention="dense",
                       seq_len=cfg.control_context, steps=cfg.control_steps, global_batch=batch, micro_batch=batch,
                       lr=cfg.lr, min_lr_ratio=1.0)
