"""Loss-spike guard: decide whether an update is applied, from the step's loss and recent applied losses."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GuardConfig:
    """When an update counts as a spike."""

    sigma: float = 6.0
    """Spike = loss above the running mean by more than sigma standard deviations (0 = only non-finite)."""
    window: int = 50
    """Recent applied-update losses in the running statistics."""
    min_history: int = 10
    """Spikes are judged only once this many losses are in the window."""
    max_consecutive: int = 5
    """This many skips in a row stop the run."""


class SpikeGuard:
    """Running mean/deviation of recent applied-update losses; `check` says 'ok', 'nonfinite' or 'spike'."""

    def __init__(self, cfg: GuardConfig, history: list[float] | None = None) -> None:
        self.cfg = cfg
        self.history: list[float] = list(history or [])[-cfg.window:]

    def threshold(self) -> float | None:
        """The loss above which an update is a spike, or None while the history is too short."""
        if self.cfg.sigma <= 0 or len(self.history) < max(2, self.cfg.min_history):
            return None
        n = len(self.history)
        mean = sum(self.history) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in self.history) / (n - 1))
        # A floor on the deviation: on a flat plateau, rounding noise alone must not count as a spike.
        std = max(std, 1e-3 * abs(mean))
        return mean + self.cfg.sigma * std

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
        del self.history[: -self.cfg.window]
