"""The whole of a network spread over several servers, seen from the launcher: one plan, commands in any node.

Measurements (:mod:`testbed.network.measure`, :mod:`testbed.network.verify`) need a network's ``topo``,
``plan`` and ``popen(node, argv)`` only.  :class:`ClusterNetwork` gives them the full plan (every server's
part together: the same names and addresses as on one machine) and runs each node's command on the node's
own server: on the launcher in the node's namespace as ``net exec`` does, elsewhere over the server's ssh
connection as ``testbed net exec --until-eof NODE -- CMD``.  The remote command ends when its ssh channel
closes, so killing the local ssh (``Popen.terminate``/``kill``, as the measurements do with a server
process such as ``iperf3 -s``) or the launcher's death ends it on the server too, where a command exec'd
in place would run on orphaned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from topologies.model import Topology

from .launch import REPO, remote_testbed
from .model import Cluster
from .placement import Placement
from .remote import Remote


@dataclass
class Impairments:
    """The impairment backends of every part, as one (what ``verify.delay_applied`` reads): the backend every
    server used, or ``mixed`` naming each; ``skipped``: what any server skipped."""

    by_server: dict[str, str | None]
    skipped: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        kinds = sorted({str(b) for b in self.by_server.values()})
        return kinds[0] if len(kinds) == 1 else "mixed(" + ", ".join(f"{s}: {b}" for s, b in
                                                                     sorted(self.by_server.items())) + ")"

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "by_server": dict(self.by_server), "skipped": list(self.skipped)}


def ssh_exec(remote: Remote, node: str, argv: list[str], pipes: list[int], container: bool = False,
             **kw: Any) -> subprocess.Popen[Any]:
    """``argv`` in ``node`` on ``remote``'s server: ssh runs ``net exec --until-eof`` (:func:`ssh_until_eof`);
    ``container``: inside the node's container (``--container``: the image's files, the container's limits)."""
    if kw.pop("env", None) is not None:
        raise ValueError("a remote node's command takes no env here (its server's own is used)")
    return ssh_until_eof(remote, ["net", "exec", "--until-eof", *(["--container"] if container else []), node, "--",
                                  *remote_argv(remote.server, argv)], pipes, **kw)


def ssh_until_eof(remote: Remote, args: list[str], pipes: list[int], owned: bool = False,
                  **kw: Any) -> subprocess.Popen[Any]:
    """``testbed ARGS`` on ``remote``'s server over its own ssh connection, its stdin a pipe whose write end is
    kept in ``pipes``: the command (which ends at EOF) lives while this process and its ssh do, and closing
    the pipe (:func:`close_all`) or this process's death ends it there too."""
    kw.pop("preexec_fn", None)
    kw.pop("stdin", None)  # its stdin is the pipe that keeps it alive
    r, w = os.pipe()
    pipes.append(w)
    try:
        # its own connection: a command that lives long (a trainer) must not end with the shared master
        p = subprocess.Popen(remote.command(remote_testbed(remote.server, args, owned=owned), shared=False),
                             stdin=r, **kw)
    finally:
        os.close(r)

    def stop_gracefully() -> None:
        """EOF on its stdin: SIGTERM to the command there (``--until-eof``), whose last output still comes
        back over the connection (a SIGTERM to the local ssh would cut it)."""
        if w in pipes:
            pipes.remove(w)
            os.close(w)

    p.stop_gracefully = stop_gracefully  # type: ignore[attr-defined]
    return p


def remote_argv(server: Any, argv: list[str]) -> list[str]:
    """``argv`` as it runs on ``server``: this interpreter is the server's Python, and a path in this checkout
    is the same path in the server's (a probe script of the testbed's, e.g. the self-test's UDP train)."""
    here = str(REPO) + "/"
    there = (server.checkout or str(REPO)).rstrip("/") + "/"
    return [server.python if a == sys.executable else there + a[len(here):] if a.startswith(here) else a
            for a in argv]


def clocks_of(report: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each server's measured clock (offset from the launcher's, error bound), in ns, from ``launch.up``'s
    report (the launcher's own is 0, 0)."""
    return {s: (int(r["clock"]["offset_ns"]), int(r["clock"]["bound_ns"]))
            for s, r in report.get("servers", {}).items() if r.get("clock")}


def offset_between(clocks: dict[str, tuple[int, int]], sender: str, receiver: str) -> tuple[float, float]:
    """(receiver's clock - sender's clock, its error bound) in seconds, for two servers."""
    a, b = clocks.get(sender, (0, 0)), clocks.get(receiver, (0, 0))
    return (b[0] - a[0]) / 1e9, (a[1] + b[1]) / 1e9


def close_all(remotes: dict[str, Remote], pipes: list[int]) -> None:
    """End every ssh connection (their remote commands with them) and the pipes that kept them alive."""
    for w in pipes:
        try:
            os.close(w)
        except OSError:
            pass
    pipes.clear()
    for r in remotes.values():
        r.close()
    remotes.clear()


class Connections:
    """What both views share: one ssh connection per server, opened on first use and kept until
    :meth:`close` (with the pipes that keep their long-lived remote commands alive)."""

    cluster: Cluster
    _remotes: dict[str, Remote]
    _pipes: list[int]

    def remote(self, server: str) -> Remote:
        """The server's ssh connection, opened once and kept until :meth:`close`."""
        if server not in self._remotes:
            self._remotes[server] = Remote(self.cluster.server(server), self.cluster)
        return self._remotes[server]

    def close(self) -> None:
        close_all(self._remotes, self._pipes)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ClusterNetwork(Connections):
    """A network up on several servers (``launch.up``), addressed as one."""

    topo: Topology
    cluster: Cluster
    placement: Placement
    impairment: Impairments
    with_ps: bool = True
    _remotes: dict[str, Remote] = field(default_factory=dict, repr=False)
    _local: Any = field(default=None, repr=False)
    _pipes: list[int] = field(default_factory=list, repr=False)
    #: temporary nodes made for a measurement (verify's probe endpoints): name -> DC
    extra: dict[str, str] = field(default_factory=dict)
    #: server -> (clock offset from the launcher's, bound), ns (:func:`clocks_of`)
    clocks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from testbed.network.addressing import plan_network

        self.plan = plan_network(self.topo, with_ps=self.with_ps)

    @classmethod
    def from_report(cls, topo: Topology, cluster: Cluster, placement: Placement, report: dict[str, Any],
                    with_ps: bool = True) -> ClusterNetwork:
        """From what ``launch.up`` returned (each server's impairment backend and what it skipped)."""
        servers = report["servers"]
        imp = Impairments({s: r.get("impairment") for s, r in servers.items()},
                          tuple(x for r in servers.values() for x in r.get("skipped", [])))
        return cls(topo, cluster, placement, imp, with_ps, clocks=clocks_of(report))

    def server_of(self, node: str) -> str:
        """The server that holds ``node`` (its DC's)."""
        dc = self.extra[node] if node in self.extra else self.plan.nodes[node].dc
        return self.placement.assignment[dc]

    def is_local(self, node: str) -> bool:
        """Whether ``node`` (or a temporary node in :attr:`extra`) is on the launcher."""
        return self.server_of(node) == self.cluster.launcher

    def clock_offset_s(self, sender: str, receiver: str) -> tuple[float, float]:
        """How far ``receiver``'s server's clock runs off ``sender``'s, and its bound (s): what one-way delay
        measurements across servers take out (testbed.network.delay_check)."""
        return offset_between(self.clocks, self.server_of(sender), self.server_of(receiver))

    def local(self) -> Any:
        """The launcher's own part, attached (its nodes' commands run through it)."""
        if self._local is None:
            from testbed.network.emulation import EmulatedNetwork

            self._local = EmulatedNetwork.attach()
        return self._local

    def popen(self, node: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``node``'s namespace on its own server (remote: :func:`ssh_exec`)."""
        if self.is_local(node):
            return self.local().popen(node, argv, **kw)
        where = self.server_of(node)
        return ssh_exec(self.remote(where), node, argv, self._pipes, **kw)

    def add_endpoint(self, dc: str, name: str, host_octet: int, ovs_port: int, as_host: bool = False) -> str:
        """A temporary node on ``dc``'s LAN, made on the DC's server (``testbed cluster part-endpoint`` over
        ssh when that is another); its commands then run there like any node's."""
        from .launch import remote_testbed

        server = self.placement.assignment[dc]
        if server == self.cluster.launcher:
            self.local().add_endpoint(dc, name, host_octet, ovs_port, as_host=as_host)
        else:
            self.remote(server).run(remote_testbed(self.cluster.server(server), [
                "cluster", "part-endpoint", "add", dc, name, str(host_octet), str(ovs_port),
                *(["--as-host"] if as_host else [])]), timeout=120)
        self.extra[name] = dc
        return name

    def remove_endpoint(self, name: str, ovs_port: int) -> None:
        from .launch import remote_testbed

        server = self.server_of(name)
        if server == self.cluster.launcher:
            self.local().remove_endpoint(name, ovs_port)
        else:
            self.remote(server).run(remote_testbed(self.cluster.server(server), [
                "cluster", "part-endpoint", "remove", name, str(ovs_port)]), timeout=120)
        self.extra.pop(name, None)



@dataclass
class ServerNetwork(Connections):
    """Shape mode's network, seen from the launcher: its nodes are the servers themselves (each one DC's host,
    :mod:`.shaper`), named as in the cluster file; a node's command runs on that server, in its own
    namespace (remote: ``net exec --until-eof SERVER`` over ssh, as for :class:`ClusterNetwork`)."""

    topo: Topology
    cluster: Cluster
    plans: dict[str, Any]  # server -> shaping.ServerShaping
    #: a trial's hosts (and parameter server) -> the server of their DC, where they run
    hosts: dict[str, str] = field(default_factory=dict)
    #: server -> (clock offset from the launcher's, bound), ns (:func:`clocks_of`)
    clocks: dict[str, tuple[int, int]] = field(default_factory=dict)
    _remotes: dict[str, Remote] = field(default_factory=dict, repr=False)
    _pipes: list[int] = field(default_factory=list, repr=False)

    def server_of(self, node: str) -> str:
        server = self.hosts.get(node, node)
        if server not in self.plans:
            raise KeyError(f"no server {node!r} in shape mode's plan")
        return server

    def is_local(self, node: str) -> bool:
        return self.server_of(node) == self.cluster.launcher

    def clock_offset_s(self, sender: str, receiver: str) -> tuple[float, float]:
        return offset_between(self.clocks, self.server_of(sender), self.server_of(receiver))

    def popen(self, node: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        server = self.server_of(node)
        if server == self.cluster.launcher:
            from testbed.network.emulation import owned_env

            return subprocess.Popen(argv, env=owned_env(node, kw.pop("env", None)), **kw)
        return ssh_exec(self.remote(server), server, argv, self._pipes, **kw)

