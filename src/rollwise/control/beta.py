"""Beta-binomial arithmetic the pass-rate policies share."""

from __future__ import annotations

import math


def beta_all_equal(a: float, b: float, r: int, success: bool) -> float:
    """P(the next r samples all succeed (or all fail)) when the pass rate is Beta(a, b): B(a+r, b) / B(a, b)."""
    if r <= 0:
        return 1.0
    x, y = (a, b) if success else (b, a)
    return math.exp(math.lgamma(x + r) + math.lgamma(x + y) - math.lgamma(x) - math.lgamma(x + y + r))
