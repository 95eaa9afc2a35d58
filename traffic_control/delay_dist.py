"""Delay distributions as tables: one definition that netem and the userspace backend both draw from.

netem draws a jittered delay as ``mu + sigma x t / 8192`` with ``t`` a random
entry of a table of signed 16-bit values (``TCA_NETEM_DELAY_DIST``; without
a table it draws uniformly within ``mu +- sigma``).  The testbed builds the
tables itself, from closed forms, and gives the *same* table to netem (over
netlink, :mod:`traffic_control.netem_codec`) and to the userspace backend's
draws (:mod:`traffic_control.jitter`), so a spec's ``distribution`` means one
thing on both backends.

Each table holds the quantiles of a standardized variate at
``u_i = (i + 1/2) / N`` (N = 4096), times 8192, rounded.  Its entries are
clipped to the int16 range, i.e. to +- 4 standard deviations (netem's format
cannot hold more), and then centred and scaled again until the table itself
has mean 0 and standard deviation 1 (to 0.1 %): ``delay D, jitter J`` with a
table distribution gives mean ``D`` and standard deviation ``J`` (before the
clip at 0 delay, which :func:`table_stats` includes), whatever the shape.

* ``normal``: the standard normal quantile.
* ``pareto``: Pareto with shape 3 (scale 1: mean 1.5, sd 0.866), standardized;
  a heavy right tail (79 of the 4096 entries sit at the +4 sd clip), its left
  side ending 0.82 sd below the mean.
* ``paretonormal``: the quantile ``0.25 x normal + 0.75 x pareto`` at the same
  ``u`` (both standardized), standardized again: skewed like pareto with a
  normal's left side (54 entries at the clip, the lowest -1.80 sd).  This is the testbed's definition; iproute2 ships a
  table of the same name built its own way, and the two are not claimed equal.

``uniform`` has no table (netem's default draw, ``U[-J, J]``, sd ``J / sqrt(3)``).
"""

from __future__ import annotations

import math
import struct
from functools import cache
from statistics import NormalDist

#: netem's fixed-point scale of table entries (``NETEM_DIST_SCALE``).
SCALE = 8192
#: Entries per table (netem takes up to ``NETEM_DIST_MAX`` = 16384).
SIZE = 4096
INT16_MAX = 32767
#: Every distribution of a jittered delay; all but ``uniform`` are tables.
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
TABLE_DISTRIBUTIONS = DISTRIBUTIONS[1:]
PARETO_SHAPE = 3.0


def _quantiles(name: str) -> list[float]:
    us = [(i + 0.5) / SIZE for i in range(SIZE)]
    normal = NormalDist()
    a = PARETO_SHAPE
    p_mean, p_sd = a / (a - 1), math.sqrt(a / ((a - 1) ** 2 * (a - 2)))

    def pareto(u: float) -> float:
        return ((1 - u) ** (-1 / a) - p_mean) / p_sd

    if name == "normal":
        return [normal.inv_cdf(u) for u in us]
    if name == "pareto":
        return [pareto(u) for u in us]
    if name == "paretonormal":
        return [0.25 * normal.inv_cdf(u) + 0.75 * pareto(u) for u in us]
    raise ValueError(f"unknown delay distribution {name!r}; use one of {', '.join(TABLE_DISTRIBUTIONS)}")


@cache
def table(name: str) -> tuple[int, ...]:
    """The int16 table of ``name``: mean 0, sd 1 (x 8192) after the clip at +- 4 sd.

    ``uniform`` is the exception: U[-1, 1] (x 8192), so that a netem leaf that had a table can be given
    netem's own default draw again (``delay +- jitter``) by a ``change``: the kernel keeps a table a
    change does not send, so leaving a table distribution means sending this one.
    """
    if name == "uniform":
        return tuple(round(((i + 0.5) / SIZE * 2 - 1) * SCALE) for i in range(SIZE))
    q = _quantiles(name)
    m, c = 0.0, 1.0
    for _ in range(100):  # centre and scale under the clip until the table's own moments are (0, 1)
        t = [max(-INT16_MAX, min(INT16_MAX, round((x * c + m) * SCALE))) for x in q]
        mean = sum(t) / SIZE / SCALE
        sd = math.sqrt(sum((v / SCALE - mean) ** 2 for v in t) / SIZE)
        if abs(mean) < 1e-4 and abs(sd - 1) < 1e-4:
            break
        c /= sd
        m = (m - mean) / sd
    return tuple(t)


def table_bytes(name: str) -> bytes:
    """The table as netem's ``TCA_NETEM_DELAY_DIST`` payload (native-endian s16 array)."""
    t = table(name)
    return struct.pack(f"={len(t)}h", *t)


def draw(name: str, jitter_s: float, index: int) -> float:
    """The offset entry ``index`` (mod the table) gives: ``jitter x t / 8192``."""
    t = table(name)
    return jitter_s * t[index % len(t)] / SCALE


def table_stats(name: str, delay_s: float, jitter_s: float, trim: float = 0.0) -> tuple[float, float, float]:
    """Mean, sd and 99th percentile of ``max(0, D + J x t / 8192)`` over the table: exact, not sampled.

    ``trim``: the sd is that of the central ``1 - 2 trim`` of the values (as ``net verify``'s
    one-way train reports it: a descheduled probe sender must not widen the link's spread).
    """
    vals = sorted(max(0.0, delay_s + jitter_s * v / SCALE) for v in table(name))
    n = len(vals)
    mean = sum(vals) / n
    cut = int(n * trim)
    central = vals[cut:n - cut]
    m = sum(central) / len(central)
    sd = math.sqrt(sum((v - m) ** 2 for v in central) / len(central))
    return mean, sd, vals[min(n - 1, math.ceil(0.99 * n) - 1)]
