"""``net set A B ... --cluster FILE`` in shape mode: one WAN link changed, every shaped path over it recomposed.

In shape mode a server shapes whole paths (one shaper per destination DC, :mod:`.shaping`), so a change to one
link of the spec moves every path that crosses it: a direct a->b path, and a relayed a->c through b.  The
launcher:

1. asks every server for its state (:func:`.show.gather`): each holds the topology it was built from and its
   paths; a DC whose server does not answer stops the change (nothing touched anywhere, exit 1);
2. changes the link in the topology (rates in spec units, times its ``scale``, as one machine's ``net set``)
   and recomposes every path along the route it was built for (routes stay as built, as emulate mode's
   routers keep theirs; a delay change does not re-route);
3. checks every changed path against its server's backend, refusing by field (exit 2) before any server is
   touched: a path that would no longer compose (jitter on two of its hops), duplication under userspace, ...;
4. applies on every server at once (``testbed cluster shape-set`` over ssh; in process on the launcher): each
   changes its shapers in place and keeps the new topology, so a later change starts from this one.

A trial's link schedule (:func:`plan_schedule`) is planned and checked whole on paper before the trial starts
training, each event from the network the ones before it left, and each event is then applied as above.

A link taken down cuts every shaped path whose route crosses it, in either direction: the server takes that
destination's shaper interface down (the veth end in its shaper namespace), so its packets are dropped as they
leave, as emulate mode's routers drop them at a downed interface (routes stay as built there too: nothing
re-routes around the cut).  The shapes keep following ``net set`` while a path is cut; taking the link up again
restores every path that crosses no other downed link.  Every server keeps the topology's downed links, so an
``up`` on one server's word is never needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from topologies.model import Topology, from_dict
from traffic_control.errors import ValidationError
from traffic_control.shape import LinkShape

from .model import Cluster
from .shaping import ServerShaping, path_shape


@dataclass
class ShapeChange:
    """What every server gets: the new topology, per server its paths' new shapes (by destination DC), the
    links down once the change is made and, per server, every destination cut then (the whole set, so a
    server applies the difference from what it holds)."""

    topology: Topology
    shapes: dict[str, dict[str, LinkShape]]
    links_down: tuple[str, ...] = ()
    cut: dict[str, list[str]] = field(default_factory=dict)

    def payload(self, server: str) -> str:
        return json.dumps({"topology": self.topology.to_dict(),
                           "shapes": {dst: asdict(s) for dst, s in self.shapes.get(server, {}).items()},
                           "links_down": list(self.links_down), "cut": self.cut.get(server, [])})


def link_key(topo: Topology, a: str, b: str) -> str:
    """A link's name in the downed set: its ends in spec order (as emulate mode names it)."""
    lk = next(lk for lk in topo.links if {lk.a, lk.b} == {a, b})
    return f"{lk.a}<->{lk.b}"


def crosses(path: tuple[str, ...] | list[str], links_down: tuple[str, ...] | list[str]) -> bool:
    """Whether a route crosses any downed link (either way)."""
    down = {frozenset(k.split("<->")) for k in links_down}
    return any(frozenset((u, v)) in down for u, v in zip(path, path[1:]))


def plan_change(states: dict[str, dict[str, Any]], dirs: list[tuple[str, str]],
                changes: dict[str, Any], state: str | None = None) -> ShapeChange:
    """The change's new shapes on every server (pure: unit-tested without servers).  ``states``: each
    shaping server's shape state; ``state``: ``down`` or ``up`` for the link of ``dirs``, or None;
    ValidationError (naming the field) when the change is refused."""
    from .shaper import check_change

    spec = next((st.get("topology_spec") for st in states.values() if st.get("topology_spec")), None)
    if spec is None:
        raise ValidationError("--cluster", "the servers' shaping records no topology (built by an older testbed)",
                              "bring the network up again (`testbed net down --cluster FILE`, then `net up`)")
    topo = from_dict(spec)
    out = dict(changes)
    if out.get("rate_bps") and topo.scale != 1.0:
        out["rate_bps"] = out["rate_bps"] * topo.scale
    links = list(topo.links)
    for a, b in dirs:
        try:
            i = next(k for k, lk in enumerate(links) if {lk.a, lk.b} == {a, b})
        except StopIteration:
            raise ValidationError("net set", f"no link {a}-{b} in topology {topo.name!r}",
                                  "use one of: " + ", ".join(f"{lk.a} {lk.b}" for lk in topo.links)) from None
        lk = links[i]
        new = lk.shape(a, b).with_changes(**out)
        links[i] = replace(lk, forward=new) if (a, b) == (lk.a, lk.b) else replace(lk, reverse=new)
    changed = replace(topo, links=tuple(links))
    down = list(next((st.get("links_down") for st in states.values() if st.get("links_down")), []))
    if state is not None:
        key = link_key(topo, *dirs[0])
        down = [k for k in down if k != key] + ([key] if state == "down" else [])
    plans = {name: ServerShaping.from_dict(st["shaping"]) for name, st in states.items()}
    paths = {(p.dc, e.dst_dc): e.path for p in plans.values() for e in p.egress}
    shapes: dict[str, dict[str, LinkShape]] = {}
    for name, p in plans.items():
        backend = (states[name].get("impairment") or {}).get("backend", "none")
        for e in p.egress:
            new, _ = path_shape(changed, p.dc, e.dst_dc, e.path, paths.get((e.dst_dc, p.dc)))
            if new != e.shape:
                check_change(backend, f"{p.dc}->{e.dst_dc}", new)
                shapes.setdefault(name, {})[e.dst_dc] = new
    cut = {name: [e.dst_dc for e in p.egress if crosses(e.path, down)] for name, p in plans.items()}
    return ShapeChange(changed, shapes, tuple(down), cut)


def paper_states(topo: Topology, plans: dict[str, ServerShaping],
                 backends: dict[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
    """The states shape-up would write for ``plans`` (a schedule checked before, or without, asking servers);
    without ``backends`` no backend is checked (it is chosen when the network comes up)."""
    return {n: {"mode": "shape", "server": n, "topology_spec": topo.to_dict(), "shaping": p.to_dict(),
                "impairment": {"backend": (backends or {}).get(n) or "unchecked"}} for n, p in plans.items()}


def shaping_states(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every shaping server's state, asked at once; RuntimeError naming a DC's server that did not answer."""
    from .show import gather

    answers = gather(cluster)
    states = {n: a["report"]["state"] for n, a in answers.items()
              if a.get("ok") and (a["report"].get("state") or {}).get("mode") == "shape"}
    if not states:
        raise RuntimeError("no server shapes a network of this cluster: "
                           + "; ".join(f"{n}: {a.get('error')}" for n, a in answers.items() if not a.get("ok")))
    spec = next(iter(states.values())).get("topology_spec") or {}
    if spec:
        from .shaping import trainer_dcs

        held = {st["shaping"]["dc"] for st in states.values()}
        lost = [dc for dc in trainer_dcs(from_dict(spec)) if dc not in held]
        if lost:
            silent = {n: a.get("error") for n, a in answers.items() if not a.get("ok")}
            raise RuntimeError(f"DC(s) {', '.join(lost)}: their server did not answer ({silent}); nothing changed")
    return states


def advanced(states: dict[str, dict[str, Any]], change: ShapeChange) -> dict[str, dict[str, Any]]:
    """The servers' states once ``change`` is applied (where a schedule's next event starts from)."""
    out = {}
    for name, st in states.items():
        shapes = change.shapes.get(name, {})
        egress = [dict(e, shape=asdict(shapes[e["dst_dc"]])) if e["dst_dc"] in shapes else e
                  for e in st["shaping"]["egress"]]
        out[name] = dict(st, topology_spec=change.topology.to_dict(), shaping=dict(st["shaping"], egress=egress),
                         links_down=list(change.links_down), cut=change.cut.get(name, []))
    return out


def plan_schedule(states: dict[str, dict[str, Any]], events: list[Any]) -> list[ShapeChange]:
    """Every event of a link schedule planned and checked on paper, each from the network the ones before it
    left; a refused event is named by its row (``schedule[i]``) and what it would break."""
    out = []
    for i, ev in enumerate(events):
        try:
            change = plan_change(states, ev.directions(), dict(ev.changes or {}), ev.state)
        except ValidationError as e:
            raise ValidationError(f"schedule[{i}]", f"the event at {ev.time_s:g} s on {ev.src}-{ev.dst}: "
                                  f"{e.field}: {e.problem}", e.fix) from None
        out.append(change)
        states = advanced(states, change)
    return out


def apply_change(cluster: Cluster, change: ShapeChange, names: list[str],
                 agents: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """``change`` applied on the servers ``names`` at once (the launcher's in process, the others by ``testbed
    cluster shape-set`` over ssh, or by their ``agents``: a trial's :class:`.linkset.Agent` on ``shape-set
    --serve``): each server's changed directions, and how long each took (s)."""
    import time

    from .launch import remote_testbed
    from .remote import Remote

    def apply(name: str) -> tuple[dict[str, Any], float]:
        t = time.monotonic()
        if name == cluster.launcher:
            from .shaper import change as change_here

            return (change_here(change.shapes.get(name, {}), change.topology.to_dict(), cut=change.cut.get(name, []),
                                links_down=list(change.links_down)), time.monotonic() - t)
        if agents and name in agents:
            out = agents[name].ask(json.loads(change.payload(name)))
            if "error" in out:
                raise RuntimeError(f"{name}: {out['error']}")
            return out, time.monotonic() - t
        server = cluster.server(name)
        with Remote(server, cluster) as r:
            cp = r.run(remote_testbed(server, ["cluster", "shape-set"]), input=change.payload(name), timeout=120)
        return json.loads(cp.stdout), time.monotonic() - t

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        done = dict(zip(names, pool.map(apply, names)))
    return {n: d[0] for n, d in done.items()}, {n: d[1] for n, d in done.items()}


def apply_everywhere(cluster: Cluster, dirs: list[tuple[str, str]], changes: dict[str, Any],
                     log: Callable[[str], None] | None = None, state: str | None = None) -> dict[str, dict[str, Any]]:
    """Plan, check and apply the change (``state``: the link ``down`` or ``up``, or None) on every server;
    ``{server: {"a->c": net show entry}}``."""
    states = shaping_states(cluster)
    change = plan_change(states, dirs, changes, state)
    held = {n: sorted(st.get("cut") or []) for n, st in states.items()}
    if not change.shapes and held == {n: sorted(c) for n, c in change.cut.items()} and log is not None:
        log("no shaped path changes (the new shape equals the old on every path, and no path is cut or restored)")
    return apply_change(cluster, change, list(states))[0]


def serve_change(req: dict[str, Any]) -> dict[str, Any]:
    """``testbed cluster shape-set`` on a server: the request the launcher sent (:meth:`ShapeChange.payload`)
    applied here; the changed directions."""
    from .shaper import change

    shapes = {dst: LinkShape(**d) for dst, d in req["shapes"].items()}  # as the shaping state holds them
    return change(shapes, req["topology"], cut=req.get("cut"), links_down=req.get("links_down"))
