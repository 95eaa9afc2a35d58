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
from dataclasses import dataclass, field
from typing import Any

from topologies.model import Topology

from .launch import remote_testbed
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


@dataclass
class ClusterNetwork:
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
        return cls(topo, cluster, placement, imp, with_ps)

    def server_of(self, node: str) -> str:
        """The server that holds ``node`` (its DC's)."""
        dc = self.extra[node] if node in self.extra else self.plan.nodes[node].dc
        return self.placement.assignment[dc]

    def is_local(self, node: str) -> bool:
        """Whether ``node`` (or a temporary node in :attr:`extra`) is on the launcher."""
        return self.server_of(node) == self.cluster.launcher

    def local(self) -> Any:
        """The launcher's own part, attached (its nodes' commands run through it)."""
        if self._local is None:
            from testbed.network.emulation import EmulatedNetwork

            self._local = EmulatedNetwork.attach()
        return self._local

    def remote(self, server: str) -> Remote:
        """The server's ssh connection, opened once and kept until :meth:`close`."""
        if server not in self._remotes:
            self._remotes[server] = Remote(self.cluster.server(server), self.cluster)
        return self._remotes[server]

    def popen(self, node: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``node``'s namespace on its own server.  Remote: ssh runs ``net exec --until-eof``
        with its stdin on a pipe held open here, so the command lives while this process and its ssh do."""
        if self.is_local(node):
            return self.local().popen(node, argv, **kw)
        where = self.server_of(node)
        if kw.pop("env", None) is not None:
            raise ValueError("a remote node's command takes no env here (its server's own is used)")
        kw.pop("preexec_fn", None)
        kw.pop("stdin", None)  # its stdin is the pipe that keeps it alive (the remote command's own is /dev/null)
        server = self.cluster.server(where)
        r, w = os.pipe()
        self._pipes.append(w)
        try:
            # its own connection: a command that lives long (a trainer) must not end with the shared master
            return subprocess.Popen(self.remote(where).command(
                remote_testbed(server, ["net", "exec", "--until-eof", node, "--", *argv]), shared=False),
                stdin=r, **kw)
        finally:
            os.close(r)

    def close(self) -> None:
        """End every ssh connection (their remote commands with them) and the pipes that kept them alive."""
        for w in self._pipes:
            try:
                os.close(w)
            except OSError:
                pass
        self._pipes.clear()
        for r in self._remotes.values():
            r.close()
        self._remotes.clear()

    def __enter__(self) -> ClusterNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
