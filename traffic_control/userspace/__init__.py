"""Userspace delay/jitter/loss for kernels without ``sch_netem``.

Packets leaving an interface are steered by a netfilter rule into an NFQUEUE;
a small daemon in the interface's network namespace holds their *ids* (never
their bytes) for the configured delay and then accepts them, or drops them
for loss.  The rate limit stays in the kernel (HTB), after the delay.  The
link fails closed: if the daemon dies, its traffic is dropped, never passed
unimpaired, until :func:`cleanup` or :meth:`UserspaceImpairment.stop`.

Entry points::

    imp = UserspaceImpairment.start("ns-or-pid", "r1-eth1", ImpairmentShape(delay_s=0.02))
    imp.change(ImpairmentShape(delay_s=0.03, jitter_s=0.002))
    imp.health().alive
    imp.stop()                      # or cleanup(netns) after any crash
"""

from __future__ import annotations

from .control import DaemonError, Health, UserspaceImpairment, Watchdog, cleanup, netns_prefix
from .shape import DISTRIBUTIONS, ImpairmentShape

__all__ = ["DISTRIBUTIONS", "DaemonError", "Health", "ImpairmentShape", "UserspaceImpairment",
           "Watchdog", "available", "cleanup", "netns_prefix"]


def available() -> tuple[bool, str]:
    """Whether this host can run the backend, and if not, why (for ``testbed doctor``).

    Binds (and at once releases) a high NFQUEUE number in the current network
    namespace: that proves ``nfnetlink_queue`` is there and we may use it;
    with no rule pointing at the queue no packet is affected.
    """
    import os
    import shutil

    if os.geteuid() != 0:
        return False, "needs root (netfilter rules and NFQUEUE need CAP_NET_ADMIN)"
    for tool, package in (("iptables", "iptables"), ("iptables-save", "iptables"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return False, f"{tool} not found (install {package})"
    from .nfq import NetlinkQueue, QueueBusy

    try:
        NetlinkQueue(PROBE_QUEUE, maxlen=1, gso=False).close()
    except QueueBusy:
        pass  # someone else holds that number: the facility works
    except OSError as exc:
        return False, f"NFQUEUE unusable: {exc} (needs root and CONFIG_NETFILTER_NETLINK_QUEUE)"
    return True, "NFQUEUE userspace impairment (iptables NFQUEUE + raw netlink)"


#: Queue number used only by :func:`available`'s probe.
PROBE_QUEUE = 65531
