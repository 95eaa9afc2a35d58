"""Jitter, defined once for every backend: a delay *process*, not a per-packet draw.

Definition (README "Jitter, defined"): a direction with one-way delay ``D``,
jitter ``J`` and a distribution (``uniform``: ``X ~ U[-J, J]``, standard
deviation ``J/sqrt(3)``; ``normal``, ``pareto``, ``paretonormal``: ``X = J t``
with ``t`` a random entry of the distribution's table, mean 0 and sd 1,
:mod:`traffic_control.delay_dist`, the same table netem is given) delays its
packets as follows.

* **Order kept** (``reorder: false``, the default).  Time is cut into
  intervals of ``tau`` (:func:`interval_s`: ``jitter_interval`` when given,
  else ``10 J``, at least 1 ms); interval ``k`` has one delay
  ``d_k = max(0, D + X_k)``, the ``X_k`` independent and seeded
  (:meth:`DelayProcess.value` is a pure function of the seed and ``k``).  A
  packet arriving at ``t`` is released at ``max(t + d(t), previous release)``.
  Every packet therefore sees the defined distribution whatever the traffic
  (bulk or sparse), except right after the delay drops from one interval to
  the next, where packets wait behind the previous one: on average
  ``E[(X_{k-1} - X_k)+^2] / (2 tau)`` of extra mean delay (``J^2 / (60 J)
  = J/60`` for uniform at the default ``tau``: 0.07 ms at J = 4 ms), which
  :func:`expected_stats` includes.
* **Reordering** (``reorder: true``): every packet draws its own ``X``
  (netem's per-packet jitter); packets overtake each other, and the
  distribution is exactly ``D + X`` clipped at 0.

Why not a draw per packet with order kept (what netem does when it also has
a rate)?  Then each release is a running maximum over the recent draws: for
bulk traffic at 10 ms +- 4 ms (uniform) the mean delay rose to about 13 ms
and the spread shrank about 4x (measured, userspace backend), so the link
was not what the spec said.  A delay that changes per interval keeps both
the order and the distribution; it is also closer to what a WAN path does
(queueing and route changes move the delay of many packets together).

The userspace backend's scheduler asks :class:`DelayProcess` for each
packet's delay; the netem backend gets the same process from a driver that
sets netem's delay to ``d_k`` at each interval (netem's own jitter off).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from . import delay_dist

#: Jitter distributions of the delay process (all but uniform are tables: traffic_control.delay_dist).
DISTRIBUTIONS = delay_dist.DISTRIBUTIONS
#: Default interval between delay draws, in units of the jitter.
INTERVAL_PER_JITTER = 10.0
#: Shortest interval (s): a faster process would cost the netem driver a netlink change per packet.
MIN_INTERVAL_S = 0.001


def interval_s(jitter_s: float, given_s: float | None = None) -> float:
    """The interval between delay draws: ``given_s``, else ``10 x jitter`` (at least 1 ms)."""
    if given_s is not None:
        return float(given_s)
    return max(MIN_INTERVAL_S, INTERVAL_PER_JITTER * jitter_s)


@dataclass(frozen=True)
class DelayProcess:
    """The one-way delay of a direction over time (module docstring); pure, seeded, no clock."""

    delay_s: float
    jitter_s: float
    distribution: str = "uniform"
    seed: int = 0
    interval_s: float = MIN_INTERVAL_S

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown jitter distribution {self.distribution!r}; use one of {DISTRIBUTIONS}")
        if not self.interval_s > 0:
            raise ValueError(f"jitter interval must be > 0, got {self.interval_s!r}")

    def draw(self, rng: random.Random) -> float:
        """One delay from ``rng``: ``max(0, D + X)``."""
        if not self.jitter_s:
            return self.delay_s
        if self.distribution == "uniform":
            x = rng.uniform(-self.jitter_s, self.jitter_s)
        else:  # an entry of the table netem draws from, uniformly (netem: rnd % size)
            x = delay_dist.draw(self.distribution, self.jitter_s, rng.randrange(delay_dist.SIZE))
        return max(0.0, self.delay_s + x)

    def value(self, k: int) -> float:
        """The delay of interval ``k``: the same for a given seed and ``k``, on any machine and backend."""
        if not self.jitter_s:
            return self.delay_s
        return self.draw(random.Random(f"{self.seed}:{k}"))

    def index(self, t: float) -> int:
        """The interval holding time ``t`` (seconds on any clock)."""
        return math.floor(t / self.interval_s)


def defined_stats(delay_s: float, jitter_s: float, distribution: str = "uniform") -> tuple[float, float]:
    """Mean and standard deviation of ``max(0, D + X)``: what the spec defines, before ordering."""
    if not jitter_s:
        return delay_s, 0.0
    if distribution == "uniform":
        if delay_s >= jitter_s:
            return delay_s, jitter_s / math.sqrt(3.0)
        # the mass below 0 is clipped to 0 (a point mass there, which adds nothing to the moments)
        hi = delay_s + jitter_s
        m1 = hi * hi / (4 * jitter_s)
        m2 = hi ** 3 / (6 * jitter_s)
        return m1, math.sqrt(max(0.0, m2 - m1 * m1))
    if distribution in delay_dist.TABLE_DISTRIBUTIONS:  # exact over the table both backends draw from
        mean, sd, _ = delay_dist.table_stats(distribution, delay_s, jitter_s)
        return mean, sd
    raise ValueError(f"unknown jitter distribution {distribution!r}")


def ordering_excess_s(jitter_s: float, interval: float, distribution: str = "uniform") -> float:
    """Mean extra delay order-keeping adds at interval boundaries: ``E[(X1 - X2)+^2] / (2 tau)``.

    ``(X1 - X2)+`` is how far the delay drops at a boundary; packets arriving
    within that much after it wait for the previous release, each by the rest
    of the drop, so the boundary costs ``drop^2 / 2`` of packet-seconds per
    ``tau`` of arrivals.  ``E[(X1-X2)+^2] = Var(X1 - X2) / 2 = Var(X)``.
    """
    if not jitter_s:
        return 0.0
    var = jitter_s ** 2 / 3 if distribution == "uniform" else jitter_s ** 2  # tables: sd 1 by construction
    return var / (2 * interval)


def expected_stats(delay_s: float, jitter_s: float, distribution: str = "uniform", *,
                   reorder: bool = False, interval: float | None = None) -> tuple[float, float]:
    """Mean and sd a dense stream of packets sees on the direction (what ``net verify`` compares with).

    With order kept the mean includes :func:`ordering_excess_s`; the sd is the
    defined one (the boundary waits are short and rare at the default interval).
    """
    mean, sd = defined_stats(delay_s, jitter_s, distribution)
    if reorder or not jitter_s:
        return mean, sd
    return mean + ordering_excess_s(jitter_s, interval_s(jitter_s, interval), distribution), sd
