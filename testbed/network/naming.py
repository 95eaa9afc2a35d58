"""Names of everything the testbed creates, all under one prefix.

Cleanup finds the testbed's objects by this prefix and touches nothing else:
named network namespaces (``tb-<node>``, and ``tb-<dc>-sw`` for each DC's
switch), cgroups (``tb-<node>``), processes carrying ``TESTBED_OWNER=tb`` in
their environment, and, with ``switch: ovs`` only, root-namespace OVS
bridges (``tb-<dc>``) and their ports (``tb-<dc>-<n>``).  A Linux-bridge
switch lives in its own namespace (bridge ``tb-<dc>``, one port per node,
named after the node), so nothing of it is in the root namespace, where the
host's firewall (Docker's FORWARD policy, bridge netfilter) would filter it.
Interface names fit Linux's 15-byte limit because DC names are at most 8
bytes (checked by the topology model).
"""

from __future__ import annotations

PREFIX = "tb"
OWNER_ENV = "TESTBED_OWNER"
STATE_DIR = "/run/geo-testbed"

IFNAMSIZ = 15


def _check(name: str) -> str:
    if len(name.encode()) > IFNAMSIZ:
        raise ValueError(f"interface name {name!r} exceeds {IFNAMSIZ} bytes")
    return name


def tunnel_name(vni: int) -> str:
    """A WAN tunnel's VXLAN interface between its creation (server's namespace) and its move into the router's
    namespace under the link's own name (testbed.cluster.tunnel)."""
    return _check(f"{PREFIX}-vx{vni}")


def host_name(dc: str, i: int) -> str:
    return f"{dc}-h{i}"


def router_name(dc: str) -> str:
    return f"{dc}-r"


def ps_name(dc: str) -> str:
    return f"{dc}-ps"


def netns_name(node: str) -> str:
    return f"{PREFIX}-{node}"


def switch_name(dc: str) -> str:
    """The DC switch's namespace is ``netns_name(switch_name(dc))``, i.e. ``tb-<dc>-sw``."""
    return f"{dc}-sw"


def probe_name(dc: str) -> str:
    """A temporary measurement endpoint on ``dc``'s LAN (``net verify`` in a DC without hosts)."""
    return f"{dc}-vp"


def bridge_name(dc: str) -> str:
    return _check(f"{PREFIX}-{dc}")


def port_name(dc: str, n: int) -> str:
    """OVS port names (root namespace, so globally unique and prefixed)."""
    return _check(f"{PREFIX}-{dc}-{n}")


def switch_port_name(node: str) -> str:
    """Linux-bridge port names inside the switch namespace: the node the port leads to."""
    return _check(node)


def wan_ifname(peer_dc: str) -> str:
    """Router interface facing ``peer_dc`` (inside the router's namespace)."""
    return _check(f"w-{peer_dc}")


LAN_IFNAME = "lan0"  # a router's LAN interface
HOST_IFNAME = "eth0"  # a host's only interface


def cgroup_name(node: str) -> str:
    return f"{PREFIX}-{node}"


def is_ours(name: str) -> bool:
    return name.startswith(PREFIX + "-")
