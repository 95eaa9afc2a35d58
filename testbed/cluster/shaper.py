"""Shape mode on one server: its own traffic to every other DC leaves through a shaper, and nothing else does.

Built on the server it shapes (``testbed cluster shape-up`` over ssh, or in process on the launcher)::

    trainer socket --(ip rule: from this machine, table 4077)--> tb-sh-<dc>  (veth, root side)
        --> [namespace tb-shape] sh-<dc> egress: HTB rate + netem leaf, or + the userspace daemon's hold
        --> back over the same veth --> the root namespace forwards it --> the server's own NIC

One veth pair per destination DC, so each carries exactly one DC pair's traffic and gets the one-machine
shaping code unchanged (``traffic_control.netlink.apply``, ``testbed.network.impairment.start``).

Why a namespace on the way out, not HTB on the NIC itself:

* the NIC's own qdisc, and every other flow of the server (ssh, storage, other jobs), stay untouched: only
  packets this machine originates for the listed destination addresses take the detour (``iif lo``);
* a packet crossing a veth into another namespace is no longer charged to its socket, so TCP Small
  Queues does not throttle a flow whose packets the userspace backend holds for the path's delay (held in
  the sender's own namespace, a 20 ms hold caps a flow at a few Mbit/s; measured in README "Several servers").
  netem would not need it (it orphans what it delays), the userspace backend does, and one path for both
  keeps the two backends' behaviour the same.

The testbed's own control traffic (ssh to and from the cluster's SSH ports: commands, clock exchanges,
fetched records) is looked up in the main table first (rules at :data:`CONTROL_PREF`), so it is never
delayed, limited or dropped by a shaper, and a daemon that died (its path fails closed) cannot cut the
launcher off the server it must clean up.  Everything else the server sends to those addresses is shaped.

What it changes in the root namespace, all found by name or marker and removed by :func:`down` (also after
a crash: ``testbed clean`` calls it): the veths ``tb-sh-*`` (they go with the namespace), routing table
:data:`TABLE`, the rule with preference :data:`PREF` that points to it and the control rules, and one ``FORWARD ... -j ACCEPT``
per veth tagged :data:`MARKER` (a Docker host's FORWARD policy is DROP; the shaped packets come back from
the namespace and are forwarded out).  Per-interface sysctls on the root-side veths (forwarding,
accept_local for packets with this machine's own source address, rp_filter off) go with the veths; no
machine-wide setting is changed.  A machine whose ``net.ipv4.conf.all.rp_filter`` is strict (1) would drop
the returning packets: refused, with the fix.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topologies.model import Topology
from traffic_control.errors import ValidationError
from traffic_control.shape import LinkShape

from ..network import naming

if TYPE_CHECKING:  # the plan's module (pydantic models) only where a plan is used: `testbed clean` imports this
    from .shaping import ServerShaping

NODE = "shape"  # the shaper's namespace is naming.netns_name(NODE): tb-shape
TABLE = 4077
PREF = 4077
CONTROL_PREF = 4076  # ssh to and from the other servers: the main table, before PREF
MARKER = "geo-testbed-shape"
STATE_FILE = "shape.json"
_LINK_NET = "169.254.77"  # /30 per destination DC: .4k+1 here, .4k+2 in the namespace


def netns() -> str:
    return naming.netns_name(NODE)


def root_ifname(dc: str) -> str:
    return f"{naming.PREFIX}-sh-{dc}"


def ns_ifname(dc: str) -> str:
    return f"sh-{dc}"


def state_path() -> Path:
    return Path(naming.STATE_DIR) / STATE_FILE


def read_state() -> dict[str, Any] | None:
    try:
        return json.loads(state_path().read_text())
    except (OSError, ValueError):
        return None


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and cp.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(cp.stderr or cp.stdout).strip()}")
    return cp


def _sysctl(path: str, value: str, netns_name: str | None = None) -> None:
    key = "/proc/sys/" + path.replace(".", "/")
    if netns_name is None:
        Path(key).write_text(value)
    else:
        _run(["ip", "netns", "exec", netns_name, "sh", "-c", f"echo {value} > {key}"])


def check_machine(s: ServerShaping) -> None:
    """What would make this server's shaping fail or lie, refused before anything is built."""
    from ..network.emulation import check_machine_free

    check_machine_free("shape mode")
    strict = Path("/proc/sys/net/ipv4/conf/all/rp_filter").read_text().strip()
    if strict == "1":
        raise ValidationError("rp_filter", f"{s.server}: net.ipv4.conf.all.rp_filter is 1 (strict): the shaped "
                              "packets come back from the shaper with this machine's own source address and "
                              "strict reverse-path filtering drops them",
                              "sysctl -w net.ipv4.conf.all.rp_filter=2 (loose, systemd's default) on that server")
    for pref in (CONTROL_PREF, PREF):
        if _run(["ip", "rule", "show", "pref", str(pref)], check=False).stdout.strip():
            raise ValidationError("rules", f"{s.server}: an ip rule with preference {pref} exists already",
                                  f"`testbed clean` if it is a testbed leftover, else remove it "
                                  f"(ip rule del pref {pref})")
    if _run(["ip", "route", "show", "table", str(TABLE)], check=False).stdout.strip():
        raise ValidationError("routes", f"{s.server}: routing table {TABLE} is in use",
                              f"`testbed clean` if it is a testbed leftover, else free table {TABLE}")
    for e in s.egress:
        mtu = _nic_mtu(e.address)
        if mtu is not None and mtu < e.shape.mtu:
            raise ValidationError(f"links ({s.dc}->{e.dst_dc}).mtu", f"{s.server} reaches {e.dst_server} over an "
                                  f"interface of MTU {mtu}, below the path's {e.shape.mtu}",
                                  "lower the links' mtu to the servers' network, or raise that network's MTU")


def gpu_assignment(topo: Topology, s: ServerShaping) -> dict[str, tuple[int, ...]]:
    """This server's GPUs per trainer host of its DC (``gpus:``; testbed.network.gpus), from its own devices:
    the launcher gives each trainer its own (CUDA_VISIBLE_DEVICES).  ValidationError naming ``dcs[i].gpus``
    when this server has too few."""
    from ..network import gpus
    from ..network.addressing import plan_network

    if not gpus.wanted(topo):
        return {}
    hosts = [(n.name, n.dc) for n in plan_network(topo).nodes.values() if n.role == "host" and n.dc == s.dc]
    return gpus.assign(topo, hosts, len(gpus.machine_gpus()))


def _nic_mtu(address: str) -> int | None:
    dev = _route_dev(address)
    try:
        return int(Path(f"/sys/class/net/{dev}/mtu").read_text()) if dev else None
    except (ValueError, OSError):
        return None


def up(topo: Topology, s: ServerShaping, *, impairment: str = "auto", allow_missing_netem: bool = False,
       seed: int | None = None, log: Any = None, shared_dirs: Any = ()) -> dict[str, Any]:
    """Build this server's shaping, then its DC's container hosts (``runtime: docker``; :mod:`.shape_hosts`,
    mounting ``shared_dirs``: where a trial's records are written on this server); returns its report.  On
    any failure everything built is removed."""
    from ..network import impairment as uimp
    from ..network.emulation import check_backend_features, choose_impairment
    from . import shape_hosts

    say = log or (lambda m: None)
    t0 = time.monotonic()
    check_machine(s)
    devices = gpu_assignment(topo, s)
    containers = shape_hosts.hosts_of(topo, s.dc, devices)
    shape_hosts.check(topo, s.dc, containers)
    imp = choose_impairment(topo, impairment, allow_missing_netem, seed=seed)
    check_backend_features(topo, imp)
    for e in s.egress:  # what a later `net set` is refused for, refused here too
        if imp.backend != "none":
            check_change(imp.backend, f"{s.dc}->{e.dst_dc}", e.shape)
    daemons: list[dict[str, Any]] = []
    ifname = trainer_ifname(s)
    if ifname is None and s.egress:
        raise ValidationError(f"servers ({s.server}).address", f"{s.server} does not reach the other DCs' servers "
                              "by one interface of its own", "give the servers addresses on one network")
    try:
        _build(s)
        import traffic_control.netlink as tcnl

        for e in s.egress:
            inner = ns_ifname(e.dst_dc)
            use_netem = imp.backend == "netem"
            tcnl.apply(inner, e.shape, netns=netns(), netem=use_netem,
                       seed=uimp.seed_for(seed, f"{NODE}.{inner}") if use_netem and seed is not None else None)
            if imp.backend == "userspace" and e.shape.needs_netem:
                d = uimp.start(netns(), uimp.Point(NODE, inner, f"{s.dc}->{e.dst_dc}"), e.shape, seed)
                daemons.append({"node": NODE, "ifname": inner, "what": f"{s.dc}->{e.dst_dc}", "pid": d.pid,
                                "state_dir": str(d.state_dir)})
        record = {"mode": "shape", "server": s.server, "topology": topo.name, "topology_spec": topo.to_dict(),
                  "shaping": s.to_dict(),
                  "impairment": imp.to_dict(), "daemons": daemons, "table": TABLE, "pref": PREF,
                  "containers": {n: s.dc for n in containers}}
        path = state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2))
        shape_hosts.start(containers, [Path(d) for d in shared_dirs], say)  # after the state: down() finds them
    except BaseException:
        say(f"{s.server}: shaping failed: removing what was built")
        down()
        raise
    from .shaping import lan_not_emulated

    report = {"dcs": [s.dc], "ifname": ifname, "nodes": 0, "tunnels": 0, "egress": len(s.egress), "impairment": imp.backend,
              "skipped": list(imp.skipped) + lan_not_emulated(topo, s.dc), "daemons": daemons, "up_s": time.monotonic() - t0,
              "applied": read_back(s), "gpus": {n: list(d) for n, d in devices.items()},
              "containers": sorted(containers)}
    if devices:  # which devices those are (model, memory): servers of a cluster need not be alike
        from ..network.gpus import machine_gpus

        report["gpu_devices"] = machine_gpus()
    say(f"{s.server}: DC {s.dc}: {len(s.egress)} destination(s) shaped, impairment {imp.backend}")
    return report


def check_change(backend: str, key: str, new: LinkShape) -> None:
    """What this server's backend cannot give a path's new shape, refused by field before anything changes
    (the launcher runs it for every server first; each server runs it again on its own state)."""
    from ..network.impairment import refuse_payload_features

    if backend == "userspace":
        refuse_payload_features(new, key)
    if backend == "netem" and new.jitter_s and not new.reorder:
        raise ValidationError(f"{key}.jitter", "jitter with order kept needs the jitter driver, which shape mode "
                              "does not run yet under netem", "reorder: true, or use mode: emulate")
    if backend == "none" and new.needs_netem:
        raise ValidationError(key, f"this network was built without an impairment backend: {new.describe()} "
                              "cannot be applied", "bring it up again with --impairment auto, netem or userspace")


def change(shapes: dict[str, LinkShape], topo_spec: dict[str, Any], *, cut: list[str] | None = None,
           links_down: list[str] | None = None) -> dict[str, Any]:
    """Give this server's shapers new path shapes (``net set --cluster`` in shape mode), in place: the HTB and
    netem leaf by ``tc change`` (open connections see no gap), the userspace daemon by its own change (started
    where a path gets its first delay or loss).  ``shapes``: destination DC -> the path's new shape.  ``cut``:
    every destination whose path crosses a downed link (``links_down``) after the change, or None for no
    change: a newly cut one's shaper interface goes down (its packets are dropped as they leave; the route
    that steers them there stays, so nothing leaks past the shaper), a restored one's comes up again.  Checked
    whole before the first is touched; returns each changed direction as ``net show`` reports it."""
    import traffic_control.netlink as tcnl

    from ..network import impairment as uimp
    from .shaping import ServerShaping

    rec = read_state()
    if rec is None:
        raise ValidationError("--cluster", "this server shapes nothing (no shape-mode network is up here)",
                              "bring the network up with `testbed net up TOPOLOGY --cluster FILE`")
    plan = ServerShaping.from_dict(rec["shaping"])
    imp = rec.get("impairment") or {}
    backend, seed = imp.get("backend", "none"), imp.get("seed")
    egress = {e.dst_dc: e for e in plan.egress}
    for dst in [*shapes, *(cut or [])]:
        if dst not in egress:
            raise ValidationError("--cluster", f"{plan.server} shapes no path {plan.dc}->{dst}",
                                  f"its paths go to: {', '.join(egress)}")
    for dst, new in shapes.items():
        check_change(backend, f"{plan.dc}->{dst}", new)
    if set(cut or []) - set(rec.get("cut") or []) and _ignores_linkdown():
        raise ValidationError("--down", f"{plan.server}: net.ipv4.conf.all.ignore_routes_with_linkdown is 1: a "
                              "cut path's route would be ignored and its packets would leave unshaped, not dropped",
                              "sysctl -w net.ipv4.conf.all.ignore_routes_with_linkdown=0 on that server")
    daemons = {d["ifname"]: d for d in rec.get("daemons", [])}
    for dst, new in shapes.items():
        inner, e = ns_ifname(dst), egress[dst]
        use_netem = backend == "netem"
        tcnl.change(inner, e.shape, new, netns=netns(), netem=use_netem,
                    seed=uimp.seed_for(seed, f"{NODE}.{inner}") if use_netem and seed is not None else None)
        if backend == "userspace":
            what = f"{plan.dc}->{dst}"
            if inner in daemons:
                uimp.change(uimp.attach(netns(), uimp.Point(NODE, inner, what)), new)
            elif new.needs_netem:
                d = uimp.start(netns(), uimp.Point(NODE, inner, what), new, seed)
                daemons[inner] = {"node": NODE, "ifname": inner, "what": what, "pid": d.pid,
                                  "state_dir": str(d.state_dir)}
        for i, ed in enumerate(rec["shaping"]["egress"]):
            if ed["dst_dc"] == dst:
                rec["shaping"]["egress"][i] = replace(e, shape=new).to_dict()
    held = set(rec.get("cut") or [])
    moved = set()
    if cut is not None:
        order = [e.dst_dc for e in plan.egress]
        for dst in sorted(held ^ set(cut), key=order.index):
            _set_cut(order.index(dst), egress[dst], dst in cut)
        moved = held ^ set(cut)
        rec["cut"] = [d for d in order if d in cut]
    if links_down is not None:
        rec["links_down"] = list(links_down)
    rec["daemons"] = list(daemons.values())
    rec["topology_spec"] = topo_spec
    state_path().write_text(json.dumps(rec, indent=2))
    from .show import shape_report

    links = (shape_report() or {}).get("links", {})
    return {k: v for k, v in links.items() if k.split("->", 1)[1] in set(shapes) | moved}


def _ignores_linkdown() -> bool:
    try:
        return Path("/proc/sys/net/ipv4/conf/all/ignore_routes_with_linkdown").read_text().strip() == "1"
    except OSError:
        return False


def _set_cut(k: int, e: Any, cut: bool) -> None:
    """Destination ``e`` (the ``k``-th of the plan) cut or restored: its shaper interface down or up.  Down,
    the veth's root end loses its carrier and drops what is routed to it (table ``TABLE`` keeps the route:
    a route over a carrier-less device stays usable unless ``ignore_routes_with_linkdown`` is set, which
    :func:`change` refuses); up, the namespace's route back, which the kernel flushed, is put back."""
    import traffic_control.netlink as tcnl

    inner = ns_ifname(e.dst_dc)
    tcnl.set_link_state(inner, not cut, netns=netns())
    if not cut:
        here, _ = _link_addresses(k)
        _run(["ip", "-n", netns(), "route", "replace", f"{e.address}/32", "via", here, "dev", inner])


def trainer_ifname(s: ServerShaping) -> str | None:
    """The interface this server reaches the other DCs' servers by (its trainers' GLOO_SOCKET_IFNAME); read
    before the shaper's rule exists (after, a route lookup from here names the shaper's veth)."""
    names = {_route_dev(e.address) for e in s.egress} - {None}
    return names.pop() if len(names) == 1 else None


def _route_dev(address: str) -> str | None:
    """The interface this machine routes ``address`` by."""
    cp = _run(["ip", "-j", "route", "get", address], check=False)
    try:
        return json.loads(cp.stdout)[0]["dev"]
    except (ValueError, KeyError, IndexError):
        return None


def _link_addresses(k: int) -> tuple[str, str]:
    """The ``k``-th destination's veth pair addresses: the root end's, the namespace end's."""
    return f"{_LINK_NET}.{4 * k + 1}", f"{_LINK_NET}.{4 * k + 2}"


def _build(s: ServerShaping) -> None:
    """The namespace, one veth pair per destination, the routes and rule that steer this machine's own
    traffic to the destinations through them, and the FORWARD accept for what comes back."""
    ns = netns()
    _run(["ip", "netns", "add", ns])
    _sysctl("net.ipv4.ip_forward", "1", ns)
    _sysctl("net.ipv4.conf.all.send_redirects", "0", ns)
    _sysctl("net.ipv4.conf.all.rp_filter", "0", ns)
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    for k, e in enumerate(s.egress):
        here, there = _link_addresses(k)
        root, inner = root_ifname(e.dst_dc), ns_ifname(e.dst_dc)
        _run(["ip", "link", "add", root, "type", "veth", "peer", "name", inner, "netns", ns])
        mtu = str(max(e.shape.mtu, 1500))
        gso = [] if s.gso else ["gso_max_segs", "1"]  # wire-sized packets from the sockets, as emulate mode's hosts
        _run(["ip", "link", "set", root, "mtu", mtu, *gso])
        _run(["ip", "-n", ns, "link", "set", inner, "mtu", mtu, *gso])
        for key, value in (("forwarding", "1"), ("accept_local", "1"), ("rp_filter", "0"),
                           ("ignore_routes_with_linkdown", "0")):  # a cut path's route must hold (_set_cut)
            _sysctl(f"net.ipv4.conf.{root}.{key}", value)
        _sysctl(f"net.ipv4.conf.{inner}.send_redirects", "0", ns)
        _sysctl(f"net.ipv4.conf.{inner}.rp_filter", "0", ns)
        _run(["ip", "addr", "add", f"{here}/30", "dev", root])
        _run(["ip", "-n", ns, "addr", "add", f"{there}/30", "dev", inner])
        _run(["ip", "link", "set", root, "up"])
        _run(["ip", "-n", ns, "link", "set", inner, "up"])
        # the namespace sends it back where it came from; the root namespace then routes it by its main table
        _run(["ip", "-n", ns, "route", "add", f"{e.address}/32", "via", here, "dev", inner])
        _run(["ip", "route", "add", f"{e.address}/32", "via", there, "dev", root, "src", s.address,
              "mtu", "lock", str(e.shape.mtu), "table", str(TABLE)])
        _run(["iptables", "-w", "-I", "FORWARD", "1", "-i", root, "-m", "comment", "--comment", MARKER,
              "-j", "ACCEPT"])
    # only what this machine sends (iif lo); what it forwards, and what comes back from tb-shape, is not steered;
    # nor is the testbed's own control traffic (ssh, either way), looked up in the main table first
    for port in s.control_ports:
        for way in ("dport", "sport"):
            _run(["ip", "rule", "add", "pref", str(CONTROL_PREF), "iif", "lo", "ipproto", "tcp", way, str(port),
                  "lookup", "main"])
    _run(["ip", "rule", "add", "pref", str(PREF), "iif", "lo", "lookup", str(TABLE)])


def read_back(s: ServerShaping) -> dict[str, Any]:
    """What the kernel holds for each destination: the qdisc tree on the namespace's veth."""
    import traffic_control.netlink as tcnl

    return {f"{NODE}:{ns_ifname(e.dst_dc)}": tcnl.show(ns_ifname(e.dst_dc), netns=netns()) for e in s.egress}


def forward_rules() -> list[list[str]]:
    """The FORWARD rules carrying :data:`MARKER` (as iptables -S prints them, split)."""
    import shlex
    import shutil

    if shutil.which("iptables") is None:
        return []
    cp = _run(["iptables", "-w", "-S", "FORWARD"], check=False)
    return [shlex.split(line) for line in cp.stdout.splitlines() if line.startswith("-A ") and MARKER in line]


def root_leftovers() -> list[str]:
    """Shape mode's root-namespace objects that exist now (the namespace and veths are counted elsewhere)."""
    out = []
    for pref in (CONTROL_PREF, PREF):
        if _run(["ip", "rule", "show", "pref", str(pref)], check=False).stdout.strip():
            out.append(f"ip rule pref {pref}")
    if _run(["ip", "route", "show", "table", str(TABLE)], check=False).stdout.strip():
        out.append(f"routing table {TABLE}")
    out += [" ".join(r) for r in forward_rules()]
    return out


def remove_root_objects() -> None:
    """The rule, the table's routes and the marked FORWARD accepts (idempotent; read from the kernel)."""
    for pref in (CONTROL_PREF, PREF):
        while _run(["ip", "rule", "del", "pref", str(pref)], check=False).returncode == 0:
            pass
    _run(["ip", "route", "flush", "table", str(TABLE)], check=False)
    for rule in forward_rules():
        _run(["iptables", "-w", "-D", *rule[1:]], check=False)


def down() -> list[str]:
    """Remove everything shape mode made on this machine (what ``testbed clean`` also finds); what went."""
    import shutil

    from ..network import cleanup, docker_hosts
    from ..network.impairment import IMPAIR_DIR

    # the DC's container hosts first (their trainers go with them); in shape mode no other network is up here
    removed = [f"container {n}" for n in docker_hosts.remove_all()]
    removed += root_leftovers()
    remove_root_objects()
    ns = netns()
    if ns in cleanup.owned_netns():
        cleanup.kill_in_netns(ns)  # the userspace daemons live there
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    for d in IMPAIR_DIR.glob(f"{NODE}.*"):
        shutil.rmtree(d, ignore_errors=True)
    state_path().unlink(missing_ok=True)
    return removed
