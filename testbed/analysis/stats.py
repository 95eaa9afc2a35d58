"""The statistics every table, figure and sweep uses, implemented once.

Confidence intervals are Student-t intervals over independent trials
(repetitions, each on a fresh network with its own seed): for the n <= 10
repetitions testbed runs usually have, the normal quantile 1.96 would make
them far too narrow (df = 4: 2.776).  The quantile comes from scipy (a
dependency already, for the planner), exact for every degree of freedom.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def t95(df: int) -> float:
    """Two-sided 95 % Student-t quantile for ``df`` degrees of freedom (NaN for df < 1)."""
    if df < 1:
        return math.nan
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def ci95(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95 % CI, n) of the finite values; half-width NaN for n < 2."""
    x = np.asarray(_finite(values), float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(x[0]), math.nan, 1
    return float(x.mean()), t95(n - 1) * float(x.std(ddof=1)) / math.sqrt(n), n


def _finite(values: Iterable[object]) -> list[float]:
    """The values that are finite numbers (text, None, NA and NaN are left out, as missing)."""
    out = []
    for v in values:
        try:
            f = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out
