"""Time-varying WAN profiles: link schedules generated from a few parameters, seeded, reproducible.

Two generators, each returning the :class:`~traffic_control.schedule.LinkEvent` list a schedule file
would hold (so ``testbed profile ...`` can write it out for review and ``net up --schedule`` or an
experiment's ``schedule:`` plays it):

* ``netstorm``: every ``every`` seconds each link direction's rate is redrawn uniformly within
  ``range`` (factors of its spec rate), as NetStorm-style studies of geo-distributed training vary
  the WAN; one seeded generator, draws in a fixed order (time, then link order, forward before
  reverse), so a seed gives the same trace on any machine.
* ``diurnal``: each rate follows a day: ``1`` at the peak and ``low`` at the trough of a cosine of
  period ``period`` (compressed: an emulated "day" of minutes), sampled every ``step``; ``phase``
  shifts the day per link (``phase_per_link``), as regions in different time zones peak apart.

Rates in a schedule are spec rates (before the topology's ``scale``), so the events carry
``factor x spec rate``; the player multiplies by ``scale`` like the topology's own rates.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from .errors import ValidationError
from .fields import Duration, SpecModel, unit_field, validate
from .schedule import LinkEvent
from .units import format_rate, format_time

#: Largest rate factor a profile may draw (a profile is a variation of the spec, not another spec).
MAX_FACTOR = 10.0
#: Most events one profile may generate (a typo in ``every`` must not produce a million rows).
MAX_EVENTS = 100_000


class NetstormSpec(SpecModel):
    """Rates redrawn uniformly within a range of the spec rate, every interval (seeded)."""

    profile: Literal["netstorm"]
    every: Duration = unit_field(..., gt=0, fix="e.g. every: 10s")
    """how often every link direction's rate is redrawn"""
    range: list[float] = unit_field(..., min_length=2, max_length=2, fix="e.g. range: [0.2, 1.0]")
    """[low, high] factors of each direction's spec rate the draws come from"""
    duration: Duration = unit_field(..., gt=0, fix="e.g. duration: 10min")
    """how long the profile runs (events at 0, every, 2 x every, ... < duration)"""
    seed: int = unit_field(0, ge=0, fix="e.g. seed: 1")
    links: list[str] | None = unit_field(None, fix="e.g. links: [east-west] (default: every link)")
    """links to vary, 'a-b' (both directions; default every link)"""


class DiurnalSpec(SpecModel):
    """Rates following a compressed day: full at the peak, ``low`` x at the trough."""

    profile: Literal["diurnal"]
    period: Duration = unit_field(..., gt=0, fix="e.g. period: 10min (one emulated day)")
    """length of one emulated day"""
    low: float = unit_field(..., gt=0, le=1, fix="e.g. low: 0.3")
    """rate factor at the trough (1 at the peak)"""
    step: Duration = unit_field(..., gt=0, fix="e.g. step: 15s")
    """how often the rate is updated"""
    duration: Duration = unit_field(..., gt=0, fix="e.g. duration: 20min")
    phase_per_link: Duration = unit_field(0.0, ge=0, fix="e.g. phase_per_link: 1min")
    """each further link's day starts this much later (time zones)"""
    links: list[str] | None = unit_field(None, fix="e.g. links: [east-west] (default: every link)")


def _validated(value: Any) -> Any:
    """A profile mapping validated by its own model first, so an error names the key as the spec writes
    it (``schedule.every``), not pydantic's union member; the schema still shows both profiles."""
    if isinstance(value, dict):
        kind = value.get("profile")
        model = PROFILES.get(str(kind))
        if model is None:
            raise ValidationError("profile", f"unknown profile {kind!r}", f"use one of: {', '.join(PROFILES)}")
        return validate(model, value)
    return value


PROFILES: dict[str, type[SpecModel]] = {"netstorm": NetstormSpec, "diurnal": DiurnalSpec}
ProfileSpec = Annotated[NetstormSpec | DiurnalSpec, Field(discriminator="profile")]
#: An experiment's ``schedule:``: a schedule file, or a profile (validated by its own model first).
ScheduleSpec = Annotated[str | ProfileSpec | None, BeforeValidator(_validated)]


def _links(topo: Any, names: list[str] | None, field: str) -> list[Any]:
    if names is None:
        return list(topo.links)
    out = []
    for i, name in enumerate(names):
        a, _, b = str(name).partition("-")
        try:
            out.append(topo.link(a, b))
        except KeyError:
            raise ValidationError(f"{field}.links[{i}]", f"no link {name!r}",
                                  "name a link as 'a-b' with two adjacent DCs: "
                                  + ", ".join(f"{lk.a}-{lk.b}" for lk in topo.links)) from None
    return out


def _spec_rate(topo: Any, shape: Any) -> float | None:
    return None if not shape.rate_bps else shape.rate_bps / topo.scale


def _kbit(bps: float) -> float:
    """A drawn rate to the kbit/s (exact in a schedule file; far below what a shaper resolves)."""
    return float(max(8, round(bps / 1000)) * 1000)


def _check_count(n: int, field: str) -> None:
    if n > MAX_EVENTS:
        raise ValidationError(field, f"the profile would generate {n} events (at most {MAX_EVENTS})",
                              "lengthen every/step or shorten duration")


def netstorm(topo: Any, spec: NetstormSpec, field: str = "schedule") -> list[LinkEvent]:
    lo, hi = spec.range
    if not 0 < lo <= hi <= MAX_FACTOR:
        raise ValidationError(f"{field}.range", f"range {spec.range} is not 0 < low <= high <= {MAX_FACTOR:g}",
                              "give factors of the spec rate, e.g. [0.2, 1.0]")
    links = _links(topo, spec.links, field)
    dirs = [d for lk in links for d in ((lk.a, lk.b, lk.forward), (lk.b, lk.a, lk.reverse))]
    shaped = [(a, b, _spec_rate(topo, s)) for a, b, s in dirs if s.rate_bps]
    if not shaped:
        raise ValidationError(f"{field}.links", "none of these links has a rate to vary", "give the links a rate")
    times = int(math.ceil(spec.duration / spec.every - 1e-9))
    _check_count(times * len(shaped), field)
    rng = random.Random(spec.seed)
    events = []
    for k in range(times):
        for a, b, rate in shaped:
            events.append(LinkEvent(round(k * spec.every, 6), a, b, False, {"rate_bps": _kbit(rate * rng.uniform(lo, hi))}))
    return events


def diurnal(topo: Any, spec: DiurnalSpec, field: str = "schedule") -> list[LinkEvent]:
    links = _links(topo, spec.links, field)
    times = int(math.ceil(spec.duration / spec.step - 1e-9))
    _check_count(times * 2 * len(links), field)
    events = []
    for k in range(times):
        t = k * spec.step
        for i, lk in enumerate(links):
            day = 2 * math.pi * (t - i * spec.phase_per_link) / spec.period
            factor = 1 - (1 - spec.low) * (1 - math.cos(day)) / 2  # 1 at t = 0 (the peak), low half a day later
            for a, b, s in ((lk.a, lk.b, lk.forward), (lk.b, lk.a, lk.reverse)):
                if s.rate_bps:
                    events.append(LinkEvent(round(t, 6), a, b, False, {"rate_bps": _kbit(_spec_rate(topo, s) * factor)}))
    if not events:
        raise ValidationError(f"{field}.links", "none of these links has a rate to vary", "give the links a rate")
    return events


def generate(topo: Any, spec: NetstormSpec | DiurnalSpec | dict[str, Any], field: str = "schedule") -> list[LinkEvent]:
    """The events of a profile spec (a mapping is validated first, errors naming ``field``)."""
    if isinstance(spec, dict):
        spec = validate(ScheduleSpec, spec, field)
    return netstorm(topo, spec, field) if isinstance(spec, NetstormSpec) else diurnal(topo, spec, field)


def to_csv(events: list[LinkEvent], comment: str = "") -> str:
    """The schedule file of ``events`` (``traffic_control.schedule`` format), with ``comment`` lines on top."""
    lines = [f"# {ln}" for ln in comment.splitlines()]
    lines.append("time,link,rate,delay,jitter,loss,state")
    for e in events:
        link = f"{e.src}-{e.dst}" if e.both else f"{e.src}->{e.dst}"
        rate = format_rate(e.changes["rate_bps"]) if "rate_bps" in e.changes else ""
        delay = format_time(e.changes["delay_s"]) if "delay_s" in e.changes else ""
        jitter = format_time(e.changes["jitter_s"]) if "jitter_s" in e.changes else ""
        loss = f"{e.changes['loss_pct']:g}%" if "loss_pct" in e.changes else ""
        lines.append(f"{e.time_s:g},{link},{rate},{delay},{jitter},{loss},{e.state or ''}")
    return "\n".join(lines) + "\n"
