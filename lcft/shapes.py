"""Shape checks shared by configs, data, training, evaluation and context parallelism, each written once."""

from __future__ import annotations

from lcft.config import ConfigError
from lcft.units import counted

MAX_BATCH = 1 << 31  # sequences in a batch: far above any run, and every figure computed from it stays finite


def check_batch(global_batch: int, micro_batch: int, dp: int = 1) -> int:
    """Accumulation steps of one optimizer step: global_batch = micro_batch x dp ranks x steps, or a clear error."""
    per_round = micro_batch * dp
    if micro_batch < 1 or dp < 1 or global_batch % per_round:
        raise ConfigError(f"global_batch {global_batch} is not a multiple of micro_batch x data-parallel ranks "
                          f"({micro_batch} x {dp}){_splitting(global_batch, per_round)}")
    return global_batch // per_round


def _splitting(global_batch: int, per_round: int) -> str:
    """': 16 would split' / ': 8 or 16 would split': the multiples of `per_round` on either side of `global_batch`
    (none below it where it is under one round), to end the batch check's message."""
    if per_round < 1:
        return ""
    near = [n for n in (global_batch // per_round * per_round, (global_batch // per_round + 1) * per_round) if n > 0]
    return f": {' or '.join(map(str, near))} would split"


def check_world(world: int, cp: int) -> int:
    """dp for a world of `world` processes split into context-parallel groups of cp; a clear error otherwise."""
    if cp < 1:
        raise ConfigError(f"cp must be at least 1, got {cp}")
    if world % cp != 0:
        processes = counted(world, "process", "processes")  # '1 process cannot', '3 processes cannot'
        raise ConfigError(
            f"world size {world} is not divisible by cp={cp} ({processes} cannot be split into "
            f"context-parallel groups of {cp}): launch a multiple of {cp} processes (e.g. --nproc {cp}) or lower --cp"
        )
    return world // cp


def length_unit(cp: int, block: int) -> int:
    """What a sequence's length must be a multiple of: whole attention blocks, and with cp > 1 2*cp chunks of
    whole blocks (the zigzag/contiguous layouts)."""
    return 2 * cp * block if cp > 1 else block


def check_length(length: int, cp: int = 1, block: int = 1, *, what: str = "window length",
                 window: int | None = None, block_name: str = "attention block", source: str = "") -> None:
    """A sequence of `length` tokens fits the data's `window` (when given), holds whole attention blocks, and
    with cp > 1 splits into 2*cp chunks of whole blocks (the zigzag/contiguous layouts)."""
    if window is not None and length > window:
        raise ConfigError(f"{what} {length} is longer than the data's windows ({window} tokens); "
                        f"prepare longer windows or use a shorter {what}")
    unit = length_unit(cp, block)
    if length > 0 and length % unit == 0:
        return
    of = f" of {source}" if source else ""
    if cp == 1:
        raise ConfigError(f"{what} {length} is not a multiple of the {block_name} size {block}{of}")
    lower, upper = (length // unit) * unit, (length // unit + 1) * unit
    hint = f"{lower} or {upper}" if lower > 0 else f"{upper}"
    raise ConfigError(f"{what} {length} is not a multiple of 2*cp*block = {unit} (cp={cp}, block={block}){of}: "
                    f"use e.g. {hint}")


def check_seq_len(seq_len: int, cp: int, sparse: bool, block: int, window: int | None = None) -> None:
    """A training sequence (`lcft train`, and `lcft plan` for what train would refuse): whole attention blocks
    under the sparse backend, and under cp > 1 (either backend: the block is the unit cp cuts a window into)
    2*cp chunks of whole blocks; dense attention at cp 1 takes any length. `window`: the data's, when known."""
    check_length(seq_len, cp, block if sparse or cp > 1 else 1, what="--seq-len", window=window,
                 block_name="sparse attention block")
