"""Each server's cores, measured where the cluster file does not give them (``servers[].cpus``).

Automatic placement balances emulated nodes per core: on a shared machine every node's processes take their
share of its cores, so a 32-core server carries four times the nodes of an 8-core one at the same fidelity.
The count is the cores this process may run on (``os.sched_getaffinity``; over ssh ``nproc``, which honours
the same affinity and cgroup cpusets), read once per command that builds a network and handed to every
placement it makes, so the placement shown, built and recorded is one.

Measured only where it matters: an automatic placement in emulate mode (a given placement, or shape mode with
one server per DC, places nothing by load).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from topologies.model import Topology

from .model import Cluster
from .remote import Remote, RemoteError


def cores_here() -> int:
    return len(os.sched_getaffinity(0))


def measure(cluster: Cluster, log: Callable[[str], None] | None = None) -> dict[str, int]:
    """Cores of every server whose ``cpus`` the file leaves out; RemoteError when one cannot be asked."""
    out: dict[str, int] = {}
    for s in cluster.servers:
        if s.cpus is not None:
            continue
        if s.name == cluster.launcher:
            out[s.name] = cores_here()
            continue
        with Remote(s, cluster) as r:
            said = r.run("nproc", timeout=max(30.0, cluster.connect_timeout * 2)).stdout.strip()
        if not said.isdigit() or int(said) < 1:
            raise RemoteError(s, f"nproc said {said!r}, not a number of cores", "give servers[].cpus in the file")
        out[s.name] = int(said)
    if out and log is not None:
        log("cores measured: " + ", ".join(f"{n}: {c}" for n, c in out.items()))
    return out


def places_by_load(cluster: Cluster) -> bool:
    """Whether the cluster's placement depends on cores: an automatic one in emulate mode."""
    return cluster.mode == "emulate" and cluster.placement is None


def measured(cluster: Cluster, log: Callable[[str], None] | None = None) -> Cluster:
    """The cluster with every server's cores known, where an automatic emulate-mode placement needs them."""
    if not places_by_load(cluster):
        return cluster
    return cluster.with_cpus(measure(cluster, log))


def for_build(topo: Topology, cluster: Cluster, log: Callable[[str], None] | None = None) -> Cluster:
    """What a command that builds across servers places with: a placement that cannot fit is refused first
    (exit 2, nothing contacted: the limits do not depend on cores), then the cores are measured."""
    if not places_by_load(cluster):
        return cluster
    from .placement import place

    place(topo, cluster)
    return measured(cluster, log)
