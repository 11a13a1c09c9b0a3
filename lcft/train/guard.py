"""Loss-spike guard: decide whether an update is applied, from the step's loss and recent applied losses."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lcft.config import ConfigError, finite


@dataclass
class GuardConfig:
    """When an update counts as a spike (the guard section of TrainConfig: the flat options --spike-sigma etc.)."""

    spike_sigma: float = 6.0
    """Skip an update whose loss exceeds the running mean by this many standard deviations (0 = off);
    non-finite losses are always skipped."""
    spike_window: int = 50
    """Number of recent applied-update losses in the spike guard's running mean and deviation."""
    spike_min_history: int = 10
    """The spike guard judges spikes only after this many applied updates (non-finite: always)."""
    max_consecutive_skips: int = 5
    """Stop the run (with a checkpoint and an error) after this many skipped updates in a row."""

    def __post_init__(self) -> None:
        if self.spike_window < 1:
            raise ConfigError(f"spike_window must be at least 1 (got {self.spike_window})")
        for name in ("spike_sigma", "spike_min_history", "max_consecutive_skips"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative (got {getattr(self, name)})")
        finite(self, "spike_sigma")


class SpikeGuard:
    """Running mean/deviation of recent applied-update losses; `check` says 'ok', 'nonfinite' or 'spike'."""

    def __init__(self, cfg: GuardConfig, history: list[float] | None = None) -> None:
        self.cfg = cfg
        self.history: list[float] = list(history or [])[-cfg.spike_window:]

    def threshold(self) -> float | None:
        """The loss above which an update is a spike, or None while the history is too short."""
        if self.cfg.spike_sigma <= 0 or len(self.history) < max(2, self.cfg.spike_min_history):
            return None
        n = len(self.history)
        mean = sum(self.history) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in self.history) / (n - 1))
        # A floor on the deviation: on a flat plateau, rounding noise alone must not count as a spike.
        std = max(std, 1e-3 * abs(mean))
        return mean + self.cfg.spike_sigma * std

    def check(self, loss: float, grad_norm: float | None = None) -> str:
        """'nonfinite' (loss or gradient norm), 'spike', or 'ok'; does not record anything."""
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            return "nonfinite"
        limit = self.threshold()
        if limit is not None and loss > limit:
            return "spike"
        return "ok"

    def record(self, loss: float) -> None:
        """Add an applied update's loss to the window."""
        self.history.append(float(loss))
        del self.history[: -self.cfg.spike_window]
