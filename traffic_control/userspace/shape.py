"""What the userspace backend applies to one direction of one link.

Plain floats on purpose: this module does not import the kernel backend's
``LinkShape`` (the two are developed separately); :meth:`ImpairmentShape.from_any`
reads any object or mapping with the same attribute names, so a ``LinkShape``
converts without either module knowing the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ..errors import ValidationError
from ..jitter import DISTRIBUTIONS as JITTER_DISTRIBUTIONS

#: Jitter distributions the scheduler can draw from (:mod:`traffic_control.jitter`).  ``uniform``
#: is netem's behaviour without a distribution table (delay +- jitter); the others draw from the
#: table netem is given (:mod:`traffic_control.delay_dist`), jitter being the standard deviation.
DISTRIBUTIONS = JITTER_DISTRIBUTIONS

#: Packets the kernel may hold for one queue when the caller gives no limit.
#: The kernel's NFQUEUE default (1024) drops at Gbit/s x tens of ms; GSO
#: super-packets count as one, so this is generous without being unbounded.
DEFAULT_LIMIT = 10000


@dataclass(frozen=True)
class ImpairmentShape:
    """One direction: one-way delay, jitter, loss, reordering, queue bound, seed.

    ``reorder=False`` keeps arrival order under jitter: the delay is drawn per
    interval of ``interval_s`` (default ``10 x jitter``) and a packet's release
    time is ``max(previous release, arrival + that interval's delay)``
    (:mod:`traffic_control.jitter` defines it for every backend).
    ``reorder=True`` gives each packet its own draw and release time, as
    netem's tfifo does.  ``limit`` bounds the packets held (kernel queue length); arrivals
    beyond it are tail-dropped by the kernel, as netem drops beyond its limit.
    """

    delay_s: float = 0.0
    jitter_s: float = 0.0
    distribution: str = "uniform"
    reorder: bool = False
    loss_pct: float = 0.0
    seed: int = 0
    limit: int = DEFAULT_LIMIT
    interval_s: float | None = None
    #: Gilbert-Elliott loss (ge_p_pct > 0; loss_pct then 0): P(good->bad), P(bad->good), loss in bad / good
    ge_p_pct: float = 0.0
    ge_r_pct: float = 0.0
    ge_loss_bad_pct: float = 100.0
    ge_loss_good_pct: float = 0.0
    #: netem's reorder: every ``reorder_gap``-th packet on is a candidate, sent at once with this probability
    reorder_pct: float = 0.0
    reorder_gap: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, field: str = "") -> None:
        """Raise :class:`ValidationError` naming ``field.<attr>`` for an impossible value."""

        def at(name: str) -> str:
            return f"{field}.{name}" if field else name

        for name in ("delay_s", "jitter_s", "loss_pct", "ge_p_pct", "ge_r_pct", "ge_loss_bad_pct", "ge_loss_good_pct",
                     "reorder_pct"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValidationError(at(name), f"must be a finite number, got {value!r}")
        if self.delay_s < 0:
            raise ValidationError(at("delay_s"), f"must be >= 0, got {self.delay_s}")
        if self.delay_s > 60:
            raise ValidationError(at("delay_s"), f"{self.delay_s} s is not a link delay",
                                  "delays are in seconds: write 0.02 for 20 ms")
        if self.jitter_s < 0:
            raise ValidationError(at("jitter_s"), f"must be >= 0, got {self.jitter_s}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValidationError(at("distribution"), f"unknown distribution {self.distribution!r}",
                                  f"use one of {', '.join(DISTRIBUTIONS)}")
        if isinstance(self.reorder_gap, bool) or not isinstance(self.reorder_gap, int) or self.reorder_gap < 1:
            raise ValidationError(at("reorder_gap"), f"must be an integer >= 1, got {self.reorder_gap!r}")
        for name in ("loss_pct", "ge_p_pct", "ge_r_pct", "ge_loss_bad_pct", "ge_loss_good_pct", "reorder_pct"):
            if not 0 <= getattr(self, name) <= 100:
                raise ValidationError(at(name), f"must be within 0..100, got {getattr(self, name)}")
        if self.ge_p_pct > 0 and (self.loss_pct > 0 or not self.ge_r_pct > 0):
            raise ValidationError(at("ge_r_pct"), "a Gilbert-Elliott model needs r > 0 and no loss_pct beside it")
        if not isinstance(self.reorder, bool):
            raise ValidationError(at("reorder"), f"must be true or false, got {self.reorder!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValidationError(at("seed"), f"must be an integer, got {self.seed!r}")
        if self.interval_s is not None and (not isinstance(self.interval_s, (int, float))
                                            or isinstance(self.interval_s, bool) or not self.interval_s > 0):
            raise ValidationError(at("interval_s"), f"must be a positive number of seconds, got {self.interval_s!r}")
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or not 1 <= self.limit <= 2**31 - 1:
            raise ValidationError(at("limit"), f"must be an integer >= 1, got {self.limit!r}")

    @property
    def reorders(self) -> bool:
        """True when packets may overtake each other (needs per-packet verdicts)."""
        return self.reorder and self.jitter_s > 0

    def with_changes(self, **changes: Any) -> ImpairmentShape:
        """A validated copy with some fields replaced."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, the one the daemon reads (plain SI units)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "") -> ImpairmentShape:
        """Inverse of :meth:`to_dict`; unknown keys are an error, not silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            where = f"{field}.{unknown[0]}" if field else unknown[0]
            raise ValidationError(where, "unknown field", f"known fields: {', '.join(sorted(known))}")
        try:
            return cls(**dict(data))
        except ValidationError as exc:
            if not field:
                raise
            raise exc.under(field) from None

    @classmethod
    def from_any(cls, shape: Any, **overrides: Any) -> ImpairmentShape:
        """Build from any object or mapping with (a subset of) these attribute names.

        ``None`` values are skipped (e.g. a ``LinkShape`` without a limit), so
        the defaults here apply.  ``overrides`` win over the object's values.
        """
        if isinstance(shape, ImpairmentShape) and not overrides:
            return shape
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = shape.get(f.name) if isinstance(shape, Mapping) else getattr(shape, f.name, None)
            if value is not None:
                values[f.name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "limit" in values:
            values["limit"] = int(values["limit"])
        return cls(**values)
