"""``testbed net show --cluster FILE``: the whole network across servers, as each server's kernel reports it.

Each server knows only its own part (emulate mode: its DCs' nodes and its tunnel ends; shape mode: its egress
per destination DC), so the launcher asks every server for its ``net show --json`` (over ssh; in process for
itself), all at once, and merges the answers into one report of the same shape as one machine's: every WAN
direction with the server that shapes it, every daemon with its server.  Nothing is changed anywhere.

What the merge can tell that no single server can:

* a server that did not answer (unreachable, or no network up there): named, with why;
* a WAN direction nobody reported: the topology (emulate mode) or the DCs the servers shape for (shape mode)
  say which directions exist, so a direction whose server is missing is listed as ``unreported``;
* a daemon dead on any server: its link fails closed there.

Any of them makes the exit status 1, as a dead daemon does for one machine's ``net show``.

A shape-mode server's own ``net show`` (:func:`shape_report`) is the same report for its shaper: one direction
per destination DC, on the veth of the shaper's namespace.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .model import Cluster


def shape_report() -> dict[str, Any] | None:
    """This server's shaper (shape mode) as ``net show --json`` reports a network; None when it shapes nothing."""
    import traffic_control.netlink as tcnl

    from ..network import impairment as uimp
    from . import shaper

    rec = shaper.read_state()
    if rec is None:
        return None
    dc, ns = rec["shaping"]["dc"], shaper.netns()
    daemons = {d["ifname"]: uimp.attach(ns, uimp.Point(d["node"], d["ifname"], d["what"]))
               for d in rec.get("daemons", [])}
    health = uimp.health_report(list(daemons.values()))
    by_if = dict(zip(daemons, health))
    links: dict[str, Any] = {}
    for e in rec["shaping"]["egress"]:
        ifn = shaper.ns_ifname(e["dst_dc"])
        entry: dict[str, Any] = {"node": shaper.NODE, "ifname": ifn, "spec": e["shape"], "path": e["path"],
                                 "to_server": e["dst_server"], "tc": tcnl.show(ifn, netns=ns),
                                 "link": tcnl.link_state(ifn, netns=ns)}
        if ifn in by_if:
            entry["userspace"] = by_if[ifn]
        links[f"{dc}->{e['dst_dc']}"] = entry
    return {"state": rec, "links": links, "impairment_health": health,
            "tc": {f"{v['node']}:{v['ifname']}": v["tc"] for v in links.values()}}


def local_report() -> dict[str, Any]:
    """This machine's ``net show --json`` (emulate mode's part, or shape mode's shaper), or why there is none."""
    from ..network import state
    from ..network.emulation import EmulatedNetwork, NotUp

    shaped = shape_report()
    if shaped is not None:
        return shaped
    try:
        net = EmulatedNetwork.attach()
    except NotUp as e:
        raise LookupError(str(e)) from None
    return emulated_report(net, state.read() or {})


def emulated_report(net: Any, rec: dict[str, Any]) -> dict[str, Any]:
    """An emulated network's ``net show --json`` (one machine's, or a server's part of a cluster's)."""
    links = net.link_report()
    return {"state": rec, "links": links, "impairment_health": net.impairment_health(),
            "tc": {f"{v['node']}:{v['ifname']}": v["tc"] for v in links.values()}}


def _remote_report(cluster: Cluster, name: str) -> dict[str, Any]:
    from .launch import remote_testbed, tail_of
    from .remote import Remote, RemoteError

    server = cluster.server(name)
    try:
        with Remote(server, cluster) as r:
            cp = r.run(remote_testbed(server, ["net", "show", "--json"]), timeout=120, check=False)
    except RemoteError as e:
        return {"ok": False, "error": str(e)}
    try:  # exit 1 with the report: a dead daemon there, still a report
        return {"ok": True, "report": json.loads(cp.stdout)}
    except ValueError:
        return {"ok": False, "error": f"no network up there ({tail_of(cp.stderr or cp.stdout, 1)})"}


def gather(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every server's answer, asked all at once: ``{server: {"ok": True, "report": ...} | {"ok": False,
    "error": why}}``."""

    def ask(name: str) -> dict[str, Any]:
        if name != cluster.launcher:
            return _remote_report(cluster, name)
        try:
            return {"ok": True, "report": local_report()}
        except LookupError as e:
            return {"ok": False, "error": str(e)}

    names = list(cluster.names)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        return dict(zip(names, pool.map(ask, names)))


def expected_directions(answers: dict[str, dict[str, Any]]) -> tuple[str | None, list[str]]:
    """(mode, every WAN direction the network has), from whichever servers answered: emulate mode's topology
    (in every part's state), or shape mode's DCs (each server's own and its destinations)."""
    from topologies.model import from_dict

    reports = [a["report"] for a in answers.values() if a.get("ok")]
    for rep in reports:
        topo = (rep.get("state") or {}).get("topology")
        if isinstance(topo, dict):
            t = from_dict(topo)
            return "emulate", sorted(f"{x}->{y}" for lk in t.links for x, y in ((lk.a, lk.b), (lk.b, lk.a)))
    dcs: set[str] = set()
    for rep in reports:
        shaping = (rep.get("state") or {}).get("shaping") or {}
        if shaping:
            dcs |= {shaping["dc"], *(e["dst_dc"] for e in shaping.get("egress", []))}
    if not dcs:
        return None, []
    return "shape", sorted(f"{x}->{y}" for x in dcs for y in dcs if x != y)


def merge(answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One report for the whole network (pure: unit-tested without servers)."""
    mode, expected = expected_directions(answers)
    links: dict[str, Any] = {}
    health: list[dict[str, Any]] = []
    servers: dict[str, Any] = {}
    for name, a in answers.items():
        if not a.get("ok"):
            servers[name] = {"ok": False, "error": a.get("error")}
            continue
        rep = a["report"]
        st = rep.get("state") or {}
        part = st.get("part") or {}
        dcs = part.get("dcs") or ([st["shaping"]["dc"]] if st.get("shaping") else [])
        imp = st.get("impairment") or {}
        servers[name] = {"ok": True, "dcs": list(dcs), "nodes": len(st.get("nodes") or {}),
                         "tunnels": len(part.get("tunnels") or {}),
                         "egress": len((st.get("shaping") or {}).get("egress") or []),
                         "impairment": imp.get("backend"), "skipped": list(imp.get("skipped") or [])}
        for key, entry in rep.get("links", {}).items():
            links[key] = {**entry, "server": name}
        health += [{**h, "server": name} for h in rep.get("impairment_health", [])]
    unreported = [d for d in expected if d not in links]
    dead = [h for h in health if not h.get("alive")]
    missing = [n for n, s in servers.items() if not s["ok"]]
    return {"mode": mode, "servers": servers, "links": dict(sorted(links.items())), "impairment_health": health,
            "unreported": unreported, "ok": not (unreported or dead or missing)}


def relays(entry: dict[str, Any]) -> str:
    """`` via b`` for a shape-mode direction whose path relays through other DCs, else nothing."""
    via = entry.get("path") or []
    return f" via {', '.join(via[1:-1])}" if len(via) > 2 else ""


def describe(merged: dict[str, Any], launcher: str, describe_link: Any, describe_daemon: Any) -> list[str]:
    """The text ``net show --cluster`` prints: servers, then every direction, then every daemon."""
    out = [f"network across {len(merged['servers'])} server(s), mode {merged['mode'] or '?'}"]
    for name, s in merged["servers"].items():
        who = f"{name}{' (this machine)' if name == launcher else ''}"
        if not s["ok"]:
            out.append(f"  {who}: NO ANSWER: {s['error']}")
            continue
        held = (f"shapes its egress to {s['egress']} DC(s)" if merged["mode"] == "shape"
                else f"{s['nodes']} node(s), {s['tunnels']} tunnel(s)")
        out.append(f"  {who}: DCs {', '.join(s['dcs']) or '-'}; {held}, impairment {s['impairment'] or '?'}"
                   + (f"; SKIPPED (not applied): {'; '.join(s['skipped'])}" if s["skipped"] else ""))
    for key, v in merged["links"].items():
        out.append(f"  {key:12} ({v['server']}{relays(v)}) {describe_link(v)}")
    for key in merged["unreported"]:
        out.append(f"  {key:12} UNREPORTED: the server that shapes it did not answer")
    out += ["  " + describe_daemon(h) for h in merged["impairment_health"]]
    return out
