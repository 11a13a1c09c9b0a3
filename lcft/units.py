"""Units of the loss figures that train and eval both report: a loss in nats over LN2 is in bits."""

from __future__ import annotations

import math

LN2 = math.log(2.0)
