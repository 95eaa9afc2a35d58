"""Build and tear down the emulated multi-DC network: Mininet hosts, pyroute2 wiring.

Division of labour (after Mininet's "Nodes execute, Intfs configure, Links
connect", done with netlink instead of string-built shell commands):

* **Nodes execute**: every host, parameter server and router is a real Mininet
  :class:`~mininet.node.Host` (own network namespace, a shell for the CLI,
  ``popen`` for processes).  Its namespace is also bound to
  ``/var/run/netns/tb-<node>`` so netlink, samplers and ``ip netns exec`` can
  reach it, and so the network outlives the builder for ``net up`` / ``net down``.
* **Links connect**: veth pairs are created with pyroute2 directly in their
  final namespaces (the root-side LAN ports are named ``tb-<dc>-<n>`` and
  enslaved to the DC's Linux bridge ``tb-<dc>``; WAN links join two routers).
* **Interfaces configure**: addresses, routes and sysctls from the
  :class:`~testbed.network.addressing.NetPlan`; shapes through
  :mod:`traffic_control.netlink`, read back after apply for the manifest.

Any failure during ``start`` removes everything created so far.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, NetNS, netns

from topologies.model import Topology
from traffic_control import netlink as tcnl
from traffic_control.capabilities import probe_kernel
from traffic_control.errors import CapabilityMissing, ValidationError
from traffic_control.netlink import NETEM_FIX
from traffic_control.shape import LinkShape

from . import cgroups, cleanup, naming
from .addressing import NetPlan, NodePlan, plan_network

IMPAIRMENTS = ("auto", "netem", "userspace", "none")

# TCP buffers large enough for a Gbit/s x 250 ms path (BDP ~ 31 MB).
TCP_MEM = "4096 131072 67108864"


def _mininet() -> Any:
    try:
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import Host
    except ImportError as e:  # pragma: no cover - depends on the OS package
        raise RuntimeError("Mininet is not importable: install the OS package (apt install mininet) and use a "
                           "venv made with --system-site-packages (scripts/bootstrap.sh does both)") from e
    setLogLevel(os.environ.get("TESTBED_MININET_LOG", "error"))

    class TestbedHost(Host):  # type: ignore[misc, valid-type]
        """A Mininet host whose processes carry the testbed's owner mark (for cleanup)."""

        def _popen(self, cmd: list[str], **params: Any) -> Any:
            env = dict(params.pop("env", None) or os.environ)
            env[naming.OWNER_ENV] = naming.PREFIX
            env["TESTBED_NODE"] = self.name
            return super()._popen(cmd, env=env, **params)

    return Mininet, TestbedHost


@dataclass
class Impairment:
    """How delay/jitter/loss are realised on this network, and what was skipped."""

    backend: str  # netem | userspace | none
    netem_available: bool
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "netem_available": self.netem_available, "skipped": self.skipped}


def choose_impairment(topo: Topology, requested: str, allow_missing_netem: bool,
                      netem_available: bool | None = None) -> Impairment:
    """Decide the impairment backend before anything is built (errors leave nothing behind)."""
    if requested not in IMPAIRMENTS:
        raise ValidationError("impairment", f"unknown backend {requested!r}", f"use one of: {', '.join(IMPAIRMENTS)}")
    if netem_available is None:
        netem_available = probe_kernel()["netem"].ok if topo.needs_netem else True
    needs = topo.needs_netem
    if not needs:
        return Impairment("none", netem_available)
    if requested == "netem" or (requested == "auto" and netem_available):
        if not netem_available:
            raise CapabilityMissing("sch_netem", NETEM_FIX)
        return Impairment("netem", True)
    if requested == "userspace" or (requested == "auto" and _userspace_available()):
        return Impairment("userspace", netem_available)
    skipped = [f"{lk.a}<->{lk.b}: {lk.forward.describe()} / {lk.reverse.describe()}" for lk in topo.links
               if lk.forward.needs_netem or lk.reverse.needs_netem]
    if requested == "none" or allow_missing_netem:
        return Impairment("none", netem_available, skipped)
    raise CapabilityMissing("sch_netem", NETEM_FIX)


def _userspace_available() -> bool:
    try:
        import traffic_control.userspace as uq  # noqa: F401

        from . import impairment  # noqa: F401  (the builder's side of the backend)
    except ImportError:
        return False
    return True


class NetworkBusy(RuntimeError):
    """Another testbed network is up on this machine (one at a time: names share the tb- prefix)."""


class EmulatedNetwork:
    """One emulated network; use as a context manager or call start()/stop()."""

    def __init__(self, topo: Topology, *, impairment: str = "auto", allow_missing_netem: bool = False,
                 with_ps: bool = True, log: Callable[[str], None] | None = None,
                 netem_available: bool | None = None) -> None:
        self.topo = topo
        self.plan: NetPlan = plan_network(topo, with_ps=with_ps)
        self.requested = impairment
        self.allow_missing_netem = allow_missing_netem
        self._netem_hint = netem_available
        self.impairment: Impairment | None = None
        self.log = log or (lambda msg: None)
        self.mn: Any = None
        self.nodes: dict[str, Any] = {}
        self.applied: dict[str, Any] = {}
        self.userspace: list[Any] = []
        self.impairment_failures: list[str] = []
        self._watchdog: Any = None
        self.started = False
        self._building = False  # True once this instance may have created objects (stop() cleans only then)
        self.timings: dict[str, float] = {}
        self._handles: dict[str, Any] = {}

    # --------------------------------------------------------------- public
    def __enter__(self) -> EmulatedNetwork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EmulatedNetwork:
        if os.geteuid() != 0:
            raise PermissionError("building the network needs root: run with sudo")
        existing = cleanup.owned_netns()
        if existing:
            raise NetworkBusy(f"a testbed network is already up ({len(existing)} namespaces, e.g. {existing[0]}); "
                               "run `testbed net down` (or `testbed clean`) first")
        self.impairment = choose_impairment(self.topo, self.requested, self.allow_missing_netem, self._netem_hint)
        if self.topo.switch == "ovs":
            from . import ovs as ovsctl

            ovsctl.require()
        if self.impairment.skipped:
            self.log("WARNING: sch_netem is missing; delay/jitter/loss are SKIPPED on: "
                     + "; ".join(self.impairment.skipped))
        t0 = time.monotonic()
        self._building = True
        try:
            self._start_nodes()
            self._handles = {n.name: NetNS(n.netns) for n in self.plan.nodes.values()}
            self.timings["nodes_s"] = time.monotonic() - t0
            self._wire()
            self.timings["wire_s"] = time.monotonic() - t0
            self._shape()
            if self.userspace:
                from .impairment import watch

                self._watchdog = watch(self)
            self.timings["shape_s"] = time.monotonic() - t0
            self._write_state()
        except BaseException:
            self._close_handles()
            self.stop()
            raise
        self._close_handles()
        self.started = True
        self.timings["up_s"] = time.monotonic() - t0
        return self

    def _close_handles(self) -> None:
        for h in self._handles.values():
            try:
                h.close()
            except Exception:
                pass
        self._handles = {}

    def _ns(self, node: str) -> Any:
        """Netlink handle into ``node``'s namespace: the one held open during start, else a new one."""
        h = self._handles.get(node)
        return h if h is not None else NetNS(self.netns(node))

    def stop(self) -> None:
        """Tear down what this instance built (cleanup by prefix).

        A no-op when start() never began building (e.g. it refused because
        another testbed network is up): that network must not be torn down.
        """
        if not self._building:
            return
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        for uq in self.userspace:
            try:
                uq.stop()
            except Exception:
                pass
        self.userspace = []
        for h in self.nodes.values():
            try:
                h.terminate()
            except Exception:
                pass
        self.nodes = {}
        self.mn = None
        cleanup.cleanup()
        self.started = False
        self._building = False

    def host(self, name: str) -> Any:
        return self.nodes[name]

    def netns(self, node: str) -> str:
        return naming.netns_name(node)

    def popen(self, node: str, argv: list[str], **kw: Any) -> Any:
        """Start ``argv`` inside ``node``'s namespace (marked for cleanup)."""
        return self.nodes[node].popen(argv, **kw)

    def cli(self) -> None:
        from mininet.cli import CLI

        CLI(self.mn)

    def wan_interfaces(self) -> list[dict[str, str]]:
        """Every shaped WAN egress: node, namespace, interface, and the DC link direction it carries."""
        out = []
        for w in self.plan.wans:
            out.append({"node": w.a_router, "netns": self.netns(w.a_router), "ifname": w.a_if, "link": f"{w.a}->{w.b}"})
            out.append({"node": w.b_router, "netns": self.netns(w.b_router), "ifname": w.b_if, "link": f"{w.b}->{w.a}"})
        return out

    def change_link(self, a: str, b: str, shape: LinkShape) -> None:
        """Change the a->b direction of a live WAN link in place (``tc change``)."""
        for w in self.plan.wans:
            for src, dst, node, ifn, attr in ((w.a, w.b, w.a_router, w.a_if, "forward"),
                                              (w.b, w.a, w.b_router, w.b_if, "reverse")):
                if (src, dst) == (a, b):
                    old = getattr(w, attr)
                    self._change(node, ifn, old, shape)
                    object.__setattr__(w, attr, shape)
                    return
        raise ValidationError("link", f"no WAN link {a}->{b}", "name two adjacent DCs")

    def shape_of(self, a: str, b: str) -> LinkShape:
        for w in self.plan.wans:
            if (w.a, w.b) == (a, b):
                return w.forward
            if (w.b, w.a) == (a, b):
                return w.reverse
        raise ValidationError("link", f"no WAN link {a}->{b}", "name two adjacent DCs")

    def apply_event(self, event: Any) -> None:
        """Apply one :class:`traffic_control.schedule.LinkEvent` (shape change and/or down/up)."""
        if event.changes:
            for a, b in event.directions():
                self.change_link(a, b, self.shape_of(a, b).with_changes(**event.changes))
        if event.state is not None:
            self.set_link_up(event.src, event.dst, event.state == "up")

    def play(self, events: list[Any]) -> Any:
        """Play a link schedule against this running network (background thread)."""
        from traffic_control.schedule import SchedulePlayer

        for ev in events:  # check every link before the first event fires
            for a, b in ev.directions():
                self.shape_of(a, b)
        return SchedulePlayer(events, self.apply_event).start()

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        """Link down/up event: both router interfaces of link a-b."""
        for w in self.plan.wans:
            if {w.a, w.b} == {a, b}:
                tcnl.set_link_state(w.a_if, up, netns=self.netns(w.a_router))
                tcnl.set_link_state(w.b_if, up, netns=self.netns(w.b_router))
                if up:  # routes through a downed interface are flushed by the kernel
                    for n in (w.a_router, w.b_router):
                        self._configure_routes(self.plan.nodes[n])
                return
        raise ValidationError("link", f"no WAN link {a}-{b}", "name two adjacent DCs")

    def read_back(self) -> dict[str, Any]:
        """The tc state the kernel reports for every shaped interface."""
        out: dict[str, Any] = {}
        for node in self.plan.nodes.values():
            for ifc in node.ifaces:
                if ifc.egress is not None and (ifc.egress.rate_bps or ifc.egress.needs_netem):
                    out[f"{node.name}:{ifc.name}"] = tcnl.show(ifc.name, netns=self.netns(node.name),
                                                               handle=self._handles.get(node.name))
            for ifc in node.ifaces:
                if ifc.port and ifc.port_egress is not None:
                    out[f"root:{ifc.port}"] = tcnl.show(ifc.port)
        return out

    # -------------------------------------------------------------- building
    def _start_nodes(self) -> None:
        """Start every node's Mininet shell, bind its namespace, set its sysctls.

        Starting a shell is mostly waiting for bash to print its prompt, so the
        nodes are started from a small thread pool and registered with Mininet
        afterwards, in plan order (Mininet's own addHost is not thread-safe).
        """
        Mininet, TestbedHost = _mininet()
        self.mn = Mininet(topo=None, build=False, controller=None, autoSetMacs=False, waitConnected=False)
        plans = list(self.plan.nodes.values())

        def start_one(node: NodePlan) -> Any:
            h = TestbedHost(node.name, ip=None)
            netns.attach(node.netns, h.pid)
            if node.cpu is not None:
                cgroups.limit(node.name, h.pid, node.cpu)
            # one shell round trip per node for the sysctls netlink cannot reach
            cmds = [f"net.ipv4.tcp_rmem='{TCP_MEM}'", f"net.ipv4.tcp_wmem='{TCP_MEM}'",
                    "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                    "net.ipv4.tcp_slow_start_after_idle=0"]
            if node.role == "router":
                cmds.append("net.ipv4.ip_forward=1")
            h.cmd("sysctl -qw " + " ".join(cmds))
            return h

        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(start_one, n) for n in plans]
            errors = []
            for node, fut in zip(plans, futures):
                try:
                    h = fut.result()
                except Exception as e:  # keep going: every started shell must be registered for cleanup
                    errors.append(f"{node.name}: {e}")
                    continue
                self.mn.hosts.append(h)
                self.mn.nameToNode[node.name] = h
                self.nodes[node.name] = h
        if errors:
            raise RuntimeError("starting nodes failed: " + "; ".join(errors))

    def _wire(self) -> None:
        from mininet.link import Intf

        def no_move(*_a: Any, **_k: Any) -> bool:
            return True

        ovs = self.topo.switch == "ovs"
        with IPRoute() as root:
            for br in self.plan.bridges:
                if ovs:
                    from . import ovs as ovsctl

                    ovsctl.add_bridge(br)
                else:
                    root.link("add", ifname=br, kind="bridge")
                root.link("set", index=root.link_lookup(ifname=br)[0], state="up")
            # LAN: root-side port on the bridge, node side created directly in the node's namespace
            for node in self.plan.nodes.values():
                pid = self.nodes[node.name].pid
                for ifc in node.ifaces:
                    if ifc.port is None:
                        continue
                    root.link("add", ifname=ifc.port, kind="veth", peer={"ifname": ifc.name, "net_ns_pid": pid})
                    pidx = root.link_lookup(ifname=ifc.port)[0]
                    if ovs:
                        ovsctl.add_port(ifc.bridge, ifc.port)
                        root.link("set", index=pidx, state="up")
                    else:
                        bidx = root.link_lookup(ifname=ifc.bridge)[0]
                        root.link("set", index=pidx, master=bidx, state="up")
        # WAN: created in router a's namespace with the peer in router b's
        for w in self.plan.wans:
            self._handles[w.a_router].link("add", ifname=w.a_if, kind="veth",
                                           peer={"ifname": w.b_if, "net_ns_pid": self.nodes[w.b_router].pid})
        for node in self.plan.nodes.values():
            ns = self._handles[node.name]
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            for ifc in node.ifaces:
                idx = ns.link_lookup(ifname=ifc.name)[0]
                ns.addr("add", index=idx, address=ifc.address, prefixlen=ifc.prefixlen)
                ns.link("set", index=idx, state="up")
            self._configure_routes(node)
            h = self.nodes[node.name]
            for port, ifc in enumerate(node.ifaces):
                intf = Intf(ifc.name, node=h, port=port, moveIntfFn=no_move)
                intf.ip, intf.prefixLen = ifc.address, ifc.prefixlen

    def _configure_routes(self, node: NodePlan) -> None:
        held = node.name in self._handles
        ns = self._ns(node.name)
        try:
            for r in node.routes:
                ns.route("replace", dst="0.0.0.0/0" if r.dst == "default" else r.dst, gateway=r.via)
        finally:
            if not held:
                ns.close()

    def _shape(self) -> None:
        assert self.impairment is not None
        use_netem = self.impairment.backend == "netem"
        for node in self.plan.nodes.values():
            for ifc in node.ifaces:
                if ifc.egress is not None and (ifc.egress.rate_bps or ifc.egress.needs_netem):
                    tcnl.apply(ifc.name, ifc.egress, netns=node.netns, netem=use_netem, handle=self._handles[node.name])
                    if self.impairment.backend == "userspace" and ifc.peer_node and ifc.egress.needs_netem:
                        self._start_userspace(node, ifc.name, ifc.egress)
                if ifc.port and ifc.port_egress is not None and (ifc.port_egress.rate_bps or ifc.port_egress.needs_netem):
                    tcnl.apply(ifc.port, ifc.port_egress, netem=use_netem)
        self.applied = self.read_back()

    def _change(self, node: str, ifname: str, old: LinkShape, new: LinkShape) -> None:
        assert self.impairment is not None
        tcnl.change(ifname, old, new, netns=self.netns(node), netem=self.impairment.backend == "netem")
        for uq in self.userspace:
            if getattr(uq, "ifname", None) == ifname and getattr(uq, "node", None) == node:
                from .impairment import to_impairment_shape

                uq.change(to_impairment_shape(new))

    def _start_userspace(self, node: NodePlan, ifname: str, shape: LinkShape) -> None:
        from .impairment import start_userspace

        self.userspace.append(start_userspace(self, node.name, ifname, shape, queue_num=len(self.userspace)))

    def _write_state(self) -> None:
        d = Path(naming.STATE_DIR)
        d.mkdir(parents=True, exist_ok=True)
        state = {"topology": self.topo.to_dict(), "impairment": self.impairment.to_dict() if self.impairment else None,
                 "nodes": {n: {"netns": p.netns, "role": p.role, "dc": p.dc, "ip": p.ip}
                           for n, p in self.plan.nodes.items()},
                 "created": time.time()}
        (d / "net.json").write_text(json.dumps(state, indent=2))


def read_state() -> dict[str, Any] | None:
    p = Path(naming.STATE_DIR) / "net.json"
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
