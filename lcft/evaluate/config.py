"""EvalConfig: the options of `lcft eval` (one dataclass, a docstring per field, as lcft/config.py expects)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Literal

from lcft.config import ConfigError, Size, check_seed, parse_size
from lcft.errors import printable
from lcft.parallel.config import LaunchConfig, ParallelConfig, Precision
from lcft.units import counted

BinScale = Literal["linear", "log"]  # position bins of equal width or growing geometrically
Position = Literal["tokens", "bases"]  # what a position counts
Probe = Literal["none", "copy"]  # the effective-context probe

# Bounds of the counts the statistics allocate for before any checkpoint runs: the bin edges (bins + 1) and the
# bootstrap's draws (replicates x windows int64: 100,000 x 10,000 windows is 8 GB).
MAX_BINS = 1 << 20
MAX_BOOTSTRAP = 100_000
# The devices lcft's model and kernels run on (torch names more: meta, mps, xpu, ...), as torch spells them; the
# index below 128 because torch keeps it in a signed byte (cuda:200 is read as cuda:-56).
DEVICE = re.compile(r"auto|cpu|cuda(:(\d|[1-9]\d|1[01]\d|12[0-7]))?")
# The options no figure of a report depends on, so a finished report is reused whatever they are
# (lcft.evaluate.report.read_back_problem), and no kept pass is keyed on them (lcft.evaluate.runner._identity):
# every launch option, as a launch's ranks hand rank 0 the losses one process computes (lcft.evaluate.parallel;
# where a launch computes otherwise, the copy probe's whole windows, the report's inputs key says so); the folder
# the report is in, moved or copied; the device by name, as its kind is keyed (`_identity`). The --data and
# --checkpoint paths stay compared though their content is keyed too: the report names them (and labels by them).
PROBE_OPTIONS = ("probe_segment", "probe_distances", "probe_mutation", "probe_windows")  # only --probe copy reads them
NOT_FIGURES = frozenset(f.name for f in fields(LaunchConfig)) | {"out", "device"}


@dataclass
class EvalConfig(ParallelConfig):
    """Held-out loss by position for one or more checkpoints on a prepared data folder (the parallel options
    nproc, cp, cp_layout, cp_kv come from ParallelConfig: dp = nproc / cp groups take turns over the windows)."""

    data: str = ""
    """Prepared data folder (the output of `lcft prepare windows`)."""
    checkpoints: tuple[str, ...] = ()
    """Checkpoints to compare, the first is the reference: a run folder (its latest checkpoint), one
    checkpoint folder, or an HF model folder or Hub id ORG/NAME[@REVISION] of a class lcft reads (Llama, Mistral,
    Qwen2, Qwen3, Mixtral)."""
    labels: tuple[str, ...] = ()
    """Names for the checkpoints in the table, CSV, JSON and plot (one per checkpoint; default: folder names)."""
    split: str = "eval"
    """Which split of the data folder to evaluate."""
    bins: int = 32
    """Number of position bins over the window (fewer where bins would be narrower than one position, as log bins
    near the window start or more bins than positions: those merge, and the table says so)."""
    bin_scale: BinScale = "linear"
    """Position bins of equal width (linear) or growing geometrically (log; detail near the window start)."""
    position: Position = "tokens"
    """What a position counts: tokens (the predicted token's index in the window), or bases (the offset of the
    predicted token's first base in the window; bins span the split's longest window in bases, and per-bin
    bits per base are nats over the bases of the bin's tokens), so runs with different tokenizers share an
    axis. With char, bases and tokens give the same figures."""
    max_context: tuple[Size, ...] = ()
    """Cut each window into independent pieces of this many tokens, each with positions from 0 (the control
    that separates the gain of a longer context from the gain of more training). One value applies to every
    checkpoint; one per checkpoint pairs them by order; 0 means the whole window (the default)."""
    max_windows: int = 0
    """Evaluate only the first N windows of the split (0 = all of them; above the split's count: all, with a
    warning)."""
    batch_size: int = 1
    """Windows per forward pass."""
    precision: Precision = "fp32"
    """Compute precision of the forward pass (losses are always accumulated in fp32/fp64). fp32 by default, where
    training's --precision auto picks by the CPU: the figures of one evaluation are compared with another's, on
    whatever machine it ran."""
    device: str = "auto"
    """Torch device: auto (CUDA when available, else CPU), cpu, cuda, cuda:1, ..."""
    out: str = "reports/eval"
    """Output folder for eval.json, loss_by_position.csv, loss_by_position.png and eval.toml. Per-token losses
    are kept in its .partial/ while the evaluation runs: run the same command again after a kill and it resumes
    (checkpoints and windows already evaluated are read back, not computed); .partial/ goes once the report is
    written."""
    verify_data: bool = True
    """Check the split's files against the manifest's sha256 before evaluating (one full read of them: about
    a second per GB; --no-verify-data skips it for very large sets, then a damaged byte goes unnoticed)."""
    bootstrap: int = 1000
    """Bootstrap replicates behind every 95% interval (held-out windows resampled with replacement, paired
    across checkpoints)."""
    seed: int = 0
    """Seed of the bootstrap draws and of the copy probe's shuffles and mutations."""
    probe: Probe = "none"
    """copy: also measure how far back each checkpoint reads: a segment planted again D tokens later, the loss
    on that second occurrence with and without the first (effective_context in eval.json)."""
    probe_segment: Size = 256
    """Copy probe: tokens in the copied segment (the last tokens of each window are its second occurrence)."""
    probe_distances: tuple[Size, ...] = ()
    """Copy probe: distances D between the two occurrences (empty: segment, 2 segment, 4 segment, ... below the
    window length minus the segment, then that length: the farthest a copy fits)."""
    probe_mutation: float = 0.1
    """Copy probe: fraction of the first occurrence's bases changed in the mutated variant, as in a diverged repeat,
    by exchanging bases among those positions so the segment keeps its base counts, as the shuffled control does
    (fewer where too few distinct bases allow it, none in a one-base segment; 0 = exact copies only)."""
    probe_windows: int = 0
    """Copy probe: run it on the first N evaluated windows (0 = all of them); each costs 3 forward passes per
    distance (2 without the mutated variant). The effective context needs 2^-N < 2.5% / distances (8 windows
    for 5 distances, 9 for 8): with fewer it reads "cannot tell"."""

    def __post_init__(self) -> None:
        self.checkpoints = tuple(str(c) for c in self.checkpoints)
        self.labels = tuple(str(lb) for lb in self.labels)
        if isinstance(self.max_context, int):
            self.max_context = (self.max_context,)
        self.max_context = tuple(_context(c) for c in self.max_context)
        self.probe_distances = tuple(_size(d, "probe_distances") for d in self.probe_distances)
        super().__post_init__()
        self._check()

    def _check(self) -> None:
        """Checks that need no files: counts of labels and limits, positive sizes."""
        if not self.data:
            raise ConfigError("no data folder given (--data DIR)")
        if not self.checkpoints:
            raise ConfigError("no checkpoint given (--checkpoint PATH, once per checkpoint)")
        n = len(self.checkpoints)
        if self.labels and len(self.labels) != n:
            raise ConfigError(f"{len(self.labels)} --label for {n} --checkpoint: give one label per checkpoint")
        blank = [i for i, lb in enumerate(self.labels, 1) if not lb.strip()]
        if blank:  # a label heads the checkpoint's table row, CSV rows and plot legend
            raise ConfigError(f"--label {blank[0]} of {n} is empty: give each checkpoint a name")
        odd = [i for i, lb in enumerate(self.labels, 1) if not lb.isprintable()]
        if odd:  # a byte that is not UTF-8 (a surrogate here) cannot be written to the CSV, TOML or plot
            raise ConfigError(f"--label {odd[0]} of {n} holds a character that is not printable text "
                              f"({printable(self.labels[odd[0] - 1])}): give a name of printable text")
        if self.labels and len(set(self.labels)) != n:
            raise ConfigError(f"labels must be distinct: {', '.join(self.labels)}")
        if len(self.max_context) not in (0, 1, n):
            raise ConfigError(
                f"{len(self.max_context)} --max-context for {n} --checkpoint: give one value for all, or one per checkpoint")
        if any(c < 0 for c in self.max_context):
            raise ConfigError("--max-context must be positive (or 0 for the whole window)")
        if not isinstance(self.device, str) or not DEVICE.fullmatch(self.device):  # only whether CUDA is here is
            # left to the run (lcft.evaluate.runner), so a launch never starts its processes for a bad name
            raise ConfigError(f"--device {printable(str(self.device))}: lcft evaluates on cpu or cuda (auto, cpu, "
                              "cuda, cuda:N with N below 128)")
        if not 1 <= self.bins <= MAX_BINS:
            raise ConfigError(f"--bins must be between 1 and {MAX_BINS:,}, got {self.bins}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.max_windows < 0:
            raise ConfigError(f"--max-windows must be 0 (all) or positive, got {self.max_windows}")
        if not 1 <= self.bootstrap <= MAX_BOOTSTRAP:
            raise ConfigError(f"--bootstrap must be between 1 and {MAX_BOOTSTRAP:,} replicates, got {self.bootstrap}")
        if self.probe_segment < 1:
            raise ConfigError(f"--probe-segment must be at least 1, got {self.probe_segment}")
        if not 0 <= self.probe_mutation < 1:
            raise ConfigError(f"--probe-mutation must be a fraction in [0, 1), got {self.probe_mutation}")
        if self.probe_windows < 0:
            raise ConfigError(f"--probe-windows must be 0 (all) or positive, got {self.probe_windows}")
        check_seed(self)

    def idle_probe(self) -> list[str]:
        """A warning when the copy probe's options (other than their defaults) are given without --probe copy, where
        no probe runs (a shared config, or the probe's flags without the one that turns it on)."""
        if self.probe != "none":
            return []
        given = [f"--{f.name.replace('_', '-')} {_shown(getattr(self, f.name))}" for f in fields(self)
                 if f.name in PROBE_OPTIONS and getattr(self, f.name) != f.default]
        if not given:
            return []
        return [f"warning: {' and '.join(given)} {'has' if len(given) == 1 else 'have'} no effect without "
                "--probe copy: no copy probe runs"]

    def windows_of(self, available: int) -> int:
        """How many of a split's `available` windows an evaluation reads: all, or the first --max-windows (a report
        read back holds this many)."""
        return min(self.max_windows, available) if self.max_windows else available

    def capped(self, available: int) -> list[str]:
        """A warning for each window count given above what is there to read, where the run reads fewer (as --bins
        above the positions: run, and said): --max-windows over the split's `available` windows, --probe-windows
        over the windows evaluated."""
        lines = []
        if self.max_windows > available:
            lines.append(more_than_held("--max-windows", self.max_windows, self.split, available))
        evaluated = self.windows_of(available)
        if self.probe != "none" and self.probe_windows > evaluated:
            lines.append(f"warning: --probe-windows {self.probe_windows:,} is more than the windows evaluated "
                         f"({evaluated:,}): the copy probe runs on all of them")
        return lines

    def context_of(self, i: int) -> int:
        """The --max-context of checkpoint i (0 = the whole window)."""
        if not self.max_context:
            return 0
        return self.max_context[0] if len(self.max_context) == 1 else self.max_context[i]


def more_than_held(flag: str, given: int, split: str, available: int) -> str:
    """The warning for a window count `flag` given above the `available` windows of `split`, where all of them are
    evaluated (a recipe that evaluates for its user names its own flag)."""
    return (f"warning: {flag} {given:,} is more than split {split!r} holds ({counted(available, 'window')}): "
            "all of them are evaluated")


def _shown(value: object) -> str:
    """An option's value as the command line gives it (a repeated option's values comma separated)."""
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


def _context(value: int | str) -> int:
    """A --max-context value: a size like 1K, or 0 for the whole window."""
    if isinstance(value, str) and value.strip() == "0":
        return 0
    try:
        return parse_size(value) if isinstance(value, str) else int(value)
    except (ConfigError, ValueError):
        raise ConfigError(f"max_context: not a size: {value!r} (use e.g. 1024, 1K, or 0 for the whole window)") from None


def _size(value: int | str, name: str) -> int:
    """A token count given as a number or a size like 4K."""
    try:
        return parse_size(value) if isinstance(value, str) else int(value)
    except (ConfigError, ValueError):
        raise ConfigError(f"{name}: not a size: {value!r} (use e.g. 300, 4K)") from None
