"""The pooled two-sided t-test TCAV's significance uses (scipy's ``ttest_ind`` default).

The degrees of freedom of a pooled test are an integer, so Student's t distribution has a
closed form (Abramowitz & Stegun 26.7.3-4): a finite sum in theta = atan(t / sqrt(df)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _central_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        # odd: (2/pi) * (theta + sin*cos * (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...)), df-3 powers
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    # even: sin * (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...), df-2 powers
    term, total = 1.0, 1.0
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def ttest_ind(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(t, p)`` of the pooled-variance two-sided t-test of ``a`` against ``b``.

    As scipy: a zero spread with different means gives t = +-inf and p = 0; equal constant
    samples give NaN for both.
    """
    n1, n2 = len(a), len(b)
    if n1 < 1 or n2 < 1 or n1 + n2 < 3:
        return math.nan, math.nan
    m1, m2 = sum(a) / n1, sum(b) / n2
    ss = sum((x - m1) ** 2 for x in a) + sum((x - m2) ** 2 for x in b)
    df = n1 + n2 - 2
    se = math.sqrt(ss / df * (1 / n1 + 1 / n2))
    diff = m1 - m2
    if se == 0:
        if diff == 0:
            return math.nan, math.nan
        return math.copysign(math.inf, diff), 0.0
    t = diff / se
    return t, max(0.0, 1.0 - _central_mass(abs(t), df))
