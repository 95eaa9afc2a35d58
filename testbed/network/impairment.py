"""Glue between the network builder and the userspace impairment backend.

Used where the kernel has no ``sch_netem``: each impaired WAN egress gets an
NFQUEUE daemon in its router's namespace (delay/jitter/loss), while the rate
stays HTB's; a DC whose LAN has delay/jitter/loss gets one on its switch: the
frames the bridge forwards reach iptables through bridge netfilter
(``br_netfilter``, ``bridge-nf-call-iptables=1`` in the switch's namespace
only) and are held there, once per delivery across the LAN (see
``addressing.lan_shapes``).  Why the switch and not the nodes: on the
sending node a held packet stays charged to its TCP socket, and TCP Small
Queues then throttles the flow; on the receiving node the kernel's receive
timestamp (what ``ping`` reports) is taken before the hold, so ping would
not show it.  At the switch the packet has left its sender and not yet
reached its receiver, as on a real LAN.

The daemons belong to the *network*, not to the command that built it: they
are started detached (own session, no parent watch), keep their state under
``/run/geo-testbed/impair/<node>.<ifname>/`` and live until
``testbed net down`` / ``testbed clean`` removes the network.  Any process
can attach to them (``testbed net show``, ``net set``, a trial).  If one
dies, its link fails closed (the kernel drops what the rule steers to the
unbound queue); the watchdog of a running trial notices within its poll
interval (0.2 s; a hung one within ``STALE_AFTER_S``) and the trial is
marked failed, never silently left without its latency.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traffic_control.errors import ValidationError
from traffic_control.shape import LinkShape

from . import naming

IMPAIR_DIR = Path(naming.STATE_DIR) / "impair"


@dataclass(frozen=True)
class Point:
    """Where one daemon sits: the egress of an interface of a node (a router, or a DC switch)."""

    node: str  # its namespace is tb-<node>
    ifname: str
    what: str  # "a->b" (a WAN direction) or "lan:<dc>"

    @property
    def key(self) -> str:
        return f"{self.node}.{self.ifname}"

    @property
    def state_dir(self) -> Path:
        return IMPAIR_DIR / self.key


def seed_for(seed: int | None, point_key: str) -> int:
    """A per-daemon (or per-qdisc) seed from the experiment seed: reproducible, distinct per place.

    ``None`` (no seed given) maps to 0 for the userspace backend, which always
    seeds its generator: a network without a seed is still reproducible.
    """
    return zlib.crc32(f"{0 if seed is None else seed}:{point_key}".encode())


def refuse_payload_features(shape: LinkShape, field: str = "") -> None:
    """ValidationError for what the userspace backend cannot do: it holds packet ids (NFQUEUE verdicts),
    not payloads, so it cannot send a packet twice or flip its bits."""
    for name, key in (("duplicate_pct", "duplicate"), ("corrupt_pct", "corrupt")):
        if getattr(shape, name):
            raise ValidationError(f"{field}.{key}" if field else key,
                                  f"the userspace impairment backend cannot {key} packets (its daemons hold packet "
                                  "ids and give verdicts; they never see or send a payload)",
                                  "use the netem backend (--impairment netem; on a kernel without sch_netem run "
                                  f"under `testbed lab -- ...`), or drop {key}")


def to_impairment_shape(shape: LinkShape, seed: int = 0) -> Any:
    from traffic_control.userspace import ImpairmentShape

    refuse_payload_features(shape)
    return ImpairmentShape(delay_s=shape.delay_s, jitter_s=shape.jitter_s, distribution=shape.jitter_distribution,
                           reorder=shape.reorder,
                           loss_pct=shape.loss_pct, seed=seed, limit=shape.netem_limit,
                           interval_s=shape.jitter_interval_s, ge_p_pct=shape.ge_p_pct, ge_r_pct=shape.ge_r_pct,
                           ge_loss_bad_pct=shape.ge_loss_bad_pct, ge_loss_good_pct=shape.ge_loss_good_pct,
                           reorder_pct=shape.reorder_pct, reorder_gap=shape.reorder_gap)


def start(netns: str, point: Point, shape: LinkShape, seed: int | None) -> Any:
    """Start a detached daemon at ``point`` (it outlives this process)."""
    from traffic_control.errors import TrafficControlError
    from traffic_control.userspace import DaemonError, UserspaceImpairment

    try:
        imp = UserspaceImpairment.start(netns, point.ifname, to_impairment_shape(shape, seed_for(seed, point.key)),
                                        state_dir=point.state_dir, detach=True)
    except DaemonError as e:
        raise TrafficControlError(f"{point.node}:{point.ifname} ({point.what}): {e}") from None
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
    """Give a running daemon a new shape (its seed is kept); a dead or hung one is an error, never ignored."""
    from traffic_control.errors import TrafficControlError
    from traffic_control.userspace import DaemonError

    try:
        imp.change(to_impairment_shape(shape, seed=imp.shape.seed))
    except DaemonError as e:
        raise TrafficControlError(f"{imp.point.node}:{imp.ifname} ({imp.point.what}): {e}") from None


def health_report(imps: list[Any]) -> list[dict[str, Any]]:
    """One entry per daemon: where, alive or why not, pid, the shape it applies, its counters."""
    out = []
    for imp in imps:
        h = imp.health()
        p = imp.point
        out.append({"node": p.node, "ifname": p.ifname, "realises": p.what,
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
        what = f"{imp.point.node}:{imp.ifname} ({imp.point.what}): {health.state} ({health.reason})"
        net.impairment_failures.append(what)
        net.impairment_noticed.append({"time": time.time(), "what": what})
        net.log(f"ERROR: userspace impairment on {imp.point.node}:{imp.ifname} ({imp.point.what}) died "
                "(its link now drops traffic: fail closed)")

    return Watchdog(net.userspace, on_death).start()


BRIDGE_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"
BRIDGE_NF_FIX = ("`modprobe br_netfilter` (it makes the host's own bridges' frames pass through iptables too, "
                 "which Docker hosts already have; the testbed itself never changes the host's settings), or "
                 "the netem backend (`testbed lab -- ...` on this machine), or no LAN delay/jitter/loss")


def bridge_netfilter_loaded() -> bool:
    """Whether bridged frames can reach iptables (and so a queue) at all: the br_netfilter module."""
    import os

    return os.path.exists(BRIDGE_NF)
