"""Glue between the network builder and the userspace impairment backend.

Used where the kernel has no ``sch_netem``: each impaired WAN egress gets an
NFQUEUE daemon in its router's namespace (delay/jitter/loss), while the rate
stays HTB's; a DC whose LAN has delay/jitter/loss gets one on the ingress of
every node's LAN interface (see ``addressing.lan_shapes``).

The daemons belong to the *network*, not to the command that built it: they
are started detached (own session, no parent watch), keep their state under
``/run/geo-testbed/impair/<node>.<ifname>.<direction>/`` and live until
``testbed net down`` / ``testbed clean`` removes the network.  Any process
can attach to them (``testbed net show``, ``net set``, a trial).  If one
dies, its link fails closed (the kernel drops what the rule steers to the
unbound queue); the watchdog of a running trial notices within its poll
interval (0.2 s; a hung one within ``STALE_AFTER_S``) and the trial is
marked failed, never silently left without its latency.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traffic_control.shape import LinkShape

from . import naming

IMPAIR_DIR = Path(naming.STATE_DIR) / "impair"


@dataclass(frozen=True)
class Point:
    """Where one daemon sits: a node's interface, a direction, and the spec element it realises."""

    node: str
    ifname: str
    direction: str  # egress | ingress
    what: str  # "a->b" (a WAN direction) or "lan:<dc>"

    @property
    def key(self) -> str:
        return f"{self.node}.{self.ifname}.{self.direction}"

    @property
    def state_dir(self) -> Path:
        return IMPAIR_DIR / self.key


def seed_for(seed: int | None, point_key: str) -> int:
    """A per-daemon (or per-qdisc) seed from the experiment seed: reproducible, distinct per place.

    ``None`` (no seed given) maps to 0 for the userspace backend, which always
    seeds its generator: a network without a seed is still reproducible.
    """
    return zlib.crc32(f"{0 if seed is None else seed}:{point_key}".encode())


def to_impairment_shape(shape: LinkShape, seed: int = 0) -> Any:
    from traffic_control.userspace import ImpairmentShape

    return ImpairmentShape(delay_s=shape.delay_s, jitter_s=shape.jitter_s, reorder=shape.reorder,
                           loss_pct=shape.loss_pct, seed=seed, limit=shape.netem_limit)


def start(netns: str, point: Point, shape: LinkShape, seed: int | None) -> Any:
    """Start a detached daemon at ``point`` (it outlives this process)."""
    from traffic_control.userspace import UserspaceImpairment

    imp = UserspaceImpairment.start(netns, point.ifname, to_impairment_shape(shape, seed_for(seed, point.key)),
                                    state_dir=point.state_dir, direction=point.direction, detach=True)
    _label(imp, point)
    return imp


def attach(netns: str, point: Point) -> Any:
    """The daemon at ``point``, started by any process (alive or not: ``health()`` says)."""
    from traffic_control.userspace import UserspaceImpairment

    imp = UserspaceImpairment.attach(point.state_dir, netns)
    _label(imp, point)
    return imp


def _label(imp: Any, point: Point) -> None:
    imp.node = point.node
    imp.point = point


def change(imp: Any, shape: LinkShape) -> None:
    """Give a running daemon a new shape (its seed is kept)."""
    imp.change(to_impairment_shape(shape, seed=imp.shape.seed))


def health_report(imps: list[Any]) -> list[dict[str, Any]]:
    """One entry per daemon: where, alive or why not, pid, the shape it applies, its counters."""
    out = []
    for imp in imps:
        h = imp.health()
        p = imp.point
        out.append({"node": p.node, "ifname": p.ifname, "direction": p.direction, "realises": p.what,
                    "alive": h.alive, "state": h.state, "reason": h.reason, "pid": imp.pid,
                    "heartbeat_age_s": h.age_s, "shape": imp.shape.to_dict(),
                    "stats": {k: h.stats.get(k) for k in ("received", "released", "lost", "held",
                                                            "kernel_queue_dropped", "late_mean_us",
                                                            "late_max_us") if k in h.stats},
                    "fail_closed": not h.alive})
    return out


def watch(net: Any) -> Any:
    """Start a watchdog over the network's daemons; deaths land in ``net.impairment_failures``."""
    from traffic_control.userspace import Watchdog

    def on_death(imp: Any, health: Any) -> None:
        net.impairment_failures.append(f"{imp.point.node}:{imp.ifname} ({imp.point.what}): "
                                       f"{health.state} ({health.reason})")
        net.log(f"ERROR: userspace impairment on {imp.point.node}:{imp.ifname} ({imp.point.what}) died "
                "(its link now drops traffic: fail closed)")

    return Watchdog(net.userspace, on_death).start()
