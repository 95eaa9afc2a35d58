"""Container hosts in shape mode: a ``runtime: docker`` DC's hosts as containers on the DC's own server.

In shape mode a DC *is* its server, so a container host cannot have an interface of its own on an emulated
LAN.  It shares the server's network namespace instead (``docker run --network host``): its trainer's
packets are originated in the root namespace like a process host's, take the shaper's rule (``iif lo``) and
leave through the per-destination HTB + netem path (:mod:`.shaper`) exactly as a process host's do.  What
the container does give, as on one machine: the image's files and ``python3``/torch, the spec's ``cpu:`` and
``memory:`` (its cgroups), ``volumes:``, ``env:``, and its GPUs through Docker's NVIDIA runtime.

Started by the shaper after its shaping is built (``shaper.up``), removed first by ``shaper.down`` and by
``testbed clean`` (the testbed's label), also after a crash of the launcher.  A trainer enters its container
the way it does on an emulated network (``docker_hosts.popen_in``); on another server, by ``net exec
--until-eof --container NODE`` over ssh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from topologies.model import Topology
from traffic_control.errors import ValidationError

from ..network import docker_hosts


def hosts_of(topo: Topology, dc: str, devices: dict[str, tuple[int, ...]] | None = None
             ) -> dict[str, docker_hosts.HostConfig]:
    """Node -> container settings for ``dc``'s trainer hosts and, where the DC holds it, the parameter server
    (empty for a ``runtime: process`` DC).  ``devices``: the server's GPUs per host (``shaper.gpu_assignment``)."""
    from ..network.addressing import plan_network

    d = topo.dc(dc)
    if d.runtime != "docker":
        return {}
    return {n.name: docker_hosts.HostConfig.of(d, n.cpu, n.memory, (devices or {}).get(n.name, ()))
            for n in plan_network(topo).nodes.values() if n.dc == dc and n.role in ("host", "ps")}


def check(topo: Topology, dc: str, hosts: dict[str, docker_hosts.HostConfig]) -> None:
    """What would stop this server's containers, refused before anything is built: no Docker daemon, the
    image missing here (the launcher sends its own before any server shapes: ``images.ensure``), GPUs
    without Docker's NVIDIA runtime."""
    if not hosts:
        return
    docker_hosts.require()
    i = [d.name for d in topo.dcs].index(dc)
    for cfg in {c.image: c for c in hosts.values()}.values():
        if docker_hosts.image_id(cfg.image) is None:
            raise ValidationError(f"dcs[{i}].image", f"image {cfg.image!r} is not in this server's Docker daemon",
                                  "build it with `testbed image build` (or load it: docker images); the launcher "
                                  "sends its own to the other servers")
    if any(c.gpus for c in hosts.values()):
        from ..network.gpus import check_docker_gpus

        check_docker_gpus()
    left = set(docker_hosts.owned())
    taken = [docker_hosts.container_name(n) for n in hosts if docker_hosts.container_name(n) in left]
    if taken:
        raise ValidationError(f"dcs[{i}]", f"container(s) {', '.join(taken)} exist already on this server",
                              "`testbed clean` if they are a testbed's leftovers")


def start(hosts: dict[str, docker_hosts.HostConfig], shared: list[Path], log: Any = None) -> dict[str, int]:
    """Start every container (``--network host``); node -> the pid of its first process.  On a failure the
    caller removes what was started (``shaper.down``)."""
    out = {}
    for node, cfg in hosts.items():
        _, pid = docker_hosts.start(node, cfg, shared, network="host")
        out[node] = pid
        if log is not None:
            log(f"{node}: container of {cfg.image} started (host network: shaped as the server's own traffic)")
    return out
