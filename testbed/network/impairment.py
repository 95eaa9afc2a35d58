"""Glue between the network builder and the userspace impairment backend.

Used where the kernel has no ``sch_netem``: each shaped WAN egress gets an
NFQUEUE daemon in its router's namespace (delay/jitter/loss), while the rate
stays HTB's.  A watchdog notices a dead daemon within its poll interval
(0.2 s; a hung one within ``STALE_AFTER_S``); the link then fails closed (its traffic is dropped), and the death is
recorded on the network so a running trial is marked failed, never silently
left without its latency.
"""

from __future__ import annotations

from typing import Any

from traffic_control.shape import LinkShape


def to_impairment_shape(shape: LinkShape, seed: int = 0) -> Any:
    from traffic_control.userspace import ImpairmentShape

    return ImpairmentShape(delay_s=shape.delay_s, jitter_s=shape.jitter_s, reorder=shape.reorder,
                           loss_pct=shape.loss_pct, seed=seed, limit=shape.netem_limit)


def start_userspace(net: Any, node: str, ifname: str, shape: LinkShape, queue_num: int) -> Any:
    from traffic_control.userspace import UserspaceImpairment

    imp = UserspaceImpairment.start(net.netns(node), ifname, to_impairment_shape(shape, seed=queue_num),
                                    queue_num=queue_num)
    imp.node = node
    return imp


def watch(net: Any) -> Any:
    """Start a watchdog over the network's daemons; deaths land in ``net.impairment_failures``."""
    from traffic_control.userspace import Watchdog

    def on_death(imp: Any, health: Any) -> None:
        net.impairment_failures.append(f"{getattr(imp, 'node', '?')}:{imp.ifname}: {health.state} ({health.reason})")
        net.log(f"ERROR: userspace impairment on {getattr(imp, 'node', '?')}:{imp.ifname} died "
                "(its link now drops traffic: fail closed)")

    return Watchdog(net.userspace, on_death).start()
