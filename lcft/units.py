"""Units of the loss figures that train and eval both report: a loss in nats over LN2 is in bits."""

from __future__ import annotations

import math

LN2 = math.log(2.0)


def bits_per_base(nats_per_token: float, tokens: float, bases: float) -> float:
    """Bits per base of a loss of `nats_per_token` over `tokens` counted tokens covering `bases` bases (0 for none):
    the same nats over the bases, so a 6-mer model and a char model share a scale."""
    return nats_per_token * tokens / bases / LN2 if bases else 0.0
