"""Beta-binomial arithmetic the pass-rate policies share."""

from __future__ import annotations

import math


def beta_all_equal(a: float, b: float, r: int, success: bool) -> float:
    """P(the next r samples all succeed (or all fail)) when the pass rate is Beta(a, b): B(a+r, b) / B(a, b)."""
    if r <= 0:
        return 1.0
    x, y = (a, b) if success else (b, a)
    return math.exp(math.lgamma(x + r) + math.lgamma(x + y) - math.lgamma(x) - math.lgamma(x + y + r))


def p_informative(belief: tuple[float, float], n: int) -> float:
    """P(a group of n samples is neither all-right nor all-wrong) when the pass rate p ~ Beta(a, b)."""
    if n < 2:
        return 0.0
    a, b = belief
    return max(0.0, 1.0 - beta_all_equal(a, b, n, True) - beta_all_equal(a, b, n, False))
