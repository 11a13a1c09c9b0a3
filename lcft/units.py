"""Units of the loss figures that train and eval both report (a loss in nats over LN2 is in bits), and counts of
things as messages say them ('1 window', '2 windows')."""

from __future__ import annotations

import math

LN2 = math.log(2.0)


def bits_per_base(nats_per_token: float, tokens: float, bases: float) -> float:
    """Bits per base of a loss of `nats_per_token` over `tokens` counted tokens covering `bases` bases (0 for none):
    the same nats over the bases, so a 6-mer model and a char model share a scale."""
    return nats_per_token * tokens / bases / LN2 if bases else 0.0


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (thousands separated) and `noun`, plural unless n is 1: '1 window', '2,048 windows'; `plural` where
    adding an 's' is wrong ('entry', 'entries')."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
