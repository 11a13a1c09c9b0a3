"""Another planting rule for the copy probe's mutated copy, to show that what is keyed on the planting tells rules
apart: round(frac * bases) bases each replaced by another base (the base counts changed)."""

from __future__ import annotations

import numpy as np

from lcft.genomics.tokenizer import A, T

# What a script runs first to plant by this rule in its own process (PYTHONPATH holding the repository).
PRELUDE = "import lcft.evaluate.probe, tests.evaluate.planting as p; lcft.evaluate.probe._mutate = p.substitute\n"


def substitute(x: np.ndarray, frac: float, rng: np.random.Generator) -> np.ndarray:
    """`x` with round(frac * bases) of its A/C/G/T tokens each replaced by one of the three other bases."""
    out, bases = x.copy(), np.flatnonzero((x >= A) & (x <= T))
    where = rng.choice(bases, size=int(round(frac * len(bases))), replace=False)
    out[where] = A + (out[where] - A + rng.integers(1, 4, size=len(where))) % 4
    return out
