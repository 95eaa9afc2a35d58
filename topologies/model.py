"""Typed, validated model of a multi-datacenter topology.

A topology is a set of data centers (each a LAN of trainer hosts behind one
router) joined by WAN links between their routers.  The WAN graph may have any
shape as long as it is connected; traffic between DCs that share no link is
relayed through intermediate DCs along routes computed from the graph.

Names end up in Linux interface and bridge names (at most 15 bytes), so DC
names are short and restricted to ``[a-z][a-z0-9]*`` (at most
:data:`MAX_DC_NAME` bytes).  Validation reports the field path of every
problem (``links[2].forward.rate``) through
:class:`traffic_control.errors.ValidationError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from traffic_control.errors import ValidationError, check_keys
from traffic_control.shape import SHAPE_KEYS, LinkShape, parse_shape_fields
from traffic_control.units import parse_size

#: Longest DC name: ``tb-<dc>-<port>`` (bridge port names) must fit in 15 bytes.
MAX_DC_NAME = 8
MAX_HOSTS_PER_DC = 64
#: Address plan limits (testbed.network.addressing): DC i owns 10.i.0.0/24, link k 10.255.k.0/30.
MAX_DCS = 250
MAX_LINKS = 250
#: bounds of a host's ``memory:`` limit (bytes)
MIN_MEMORY, MAX_MEMORY = 16 * 2**20, 2**40
_NAME_RE = re.compile(r"[a-z][a-z0-9]*")

DEFAULT_LAN = LinkShape()  # unshaped unless the spec says otherwise


def check_name(name: object, field: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValidationError(field, f"expected a name, got {name!r}", "use lower-case letters and digits, e.g. 'virginia'")
    if not _NAME_RE.fullmatch(name):
        raise ValidationError(field, f"name {name!r} has characters other than a-z, 0-9 or does not start with a letter",
                              "use lower-case letters and digits, starting with a letter")
    if len(name.encode()) > MAX_DC_NAME:
        raise ValidationError(field, f"name {name!r} is {len(name)} bytes; at most {MAX_DC_NAME} fit in "
                              "Linux interface names (15 bytes)", f"shorten it, e.g. {name[:MAX_DC_NAME]!r}")
    return name


@dataclass(frozen=True)
class DataCenter:
    """One data center: a LAN (switch) with ``hosts`` trainer hosts behind one router."""

    name: str
    hosts: int = 2
    lan: LinkShape = DEFAULT_LAN
    cpu: float | None = None  # CPU share per host, as a fraction of one core
    label: str = ""  # free text (region name), shown in reports
    memory: int | None = None  # memory limit per host, bytes (its cgroup; past it the OOM killer acts)

    def host_names(self) -> list[str]:
        return [f"{self.name}-h{i}" for i in range(1, self.hosts + 1)]


@dataclass(frozen=True)
class WanLink:
    """A router-to-router link; ``forward`` shapes a->b, ``reverse`` shapes b->a."""

    a: str
    b: str
    forward: LinkShape
    reverse: LinkShape

    @property
    def key(self) -> tuple[str, str]:
        return (self.a, self.b)

    def shape(self, src: str, dst: str) -> LinkShape:
        if (src, dst) == (self.a, self.b):
            return self.forward
        if (src, dst) == (self.b, self.a):
            return self.reverse
        raise KeyError((src, dst))

    @property
    def symmetric(self) -> bool:
        return self.forward == self.reverse


@dataclass(frozen=True)
class Topology:
    name: str
    dcs: tuple[DataCenter, ...]
    links: tuple[WanLink, ...]
    ps: str | None = None
    scale: float = 1.0
    description: str = ""
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "a->c": (a, b, c)
    switch: str = "bridge"
    source: str = field(default="", compare=False)  # where it was loaded from (not part of the spec)

    # ---------------------------------------------------------------- views
    def dc(self, name: str) -> DataCenter:
        for d in self.dcs:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def dc_names(self) -> list[str]:
        return [d.name for d in self.dcs]

    def link(self, a: str, b: str) -> WanLink:
        for lk in self.links:
            if {lk.a, lk.b} == {a, b}:
                return lk
        raise KeyError((a, b))

    def dc_graph(self) -> nx.DiGraph:
        """Directed DC graph: an edge per link direction with ``rate_bps`` and ``delay_s``.

        Unshaped directions get ``rate_bps = inf``.  This is what the planners read.
        """
        g = nx.DiGraph()
        for d in self.dcs:
            g.add_node(d.name, hosts=d.hosts, lan_rate_bps=d.lan.rate_bps, lan_delay_s=d.lan.delay_s)
        for lk in self.links:
            for (u, v), s in (((lk.a, lk.b), lk.forward), ((lk.b, lk.a), lk.reverse)):
                g.add_edge(u, v, rate_bps=s.rate_bps if s.rate_bps else float("inf"),
                           delay_s=s.delay_s, jitter_s=s.jitter_s, loss_pct=s.loss_pct)
        return g

    def next_hop(self, here: str, dst: str) -> str:
        """The DC a router at ``here`` forwards traffic for ``dst``'s LAN to.

        Routing is per destination at every router, as in a real IP network: a
        pinned route ``here->dst`` fixes the first hop; otherwise the path of
        least one-way delay (ties: fewest hops) is used.
        """
        pinned = self.routes.get(f"{here}->{dst}")
        if pinned:
            return pinned[1]
        return self._shortest(here, dst)[1]

    def _shortest(self, src: str, dst: str) -> list[str]:
        g = self.dc_graph()
        # a tiny per-hop cost breaks ties between equal-delay paths in favour of fewer hops
        return nx.shortest_path(g, src, dst, weight=lambda u, v, d: d["delay_s"] + 1e-9)

    def path(self, src: str, dst: str) -> list[str]:
        """DC path that packets src->dst really take: the routers' next hops followed."""
        out = [src]
        while out[-1] != dst:
            nxt = self.next_hop(out[-1], dst)
            if nxt in out:
                raise ValidationError("routes", f"pinned routes make a loop for traffic {src}->{dst}: {out + [nxt]}",
                                      "pin routes whose later hops agree with each other")
            out.append(nxt)
        return out

    def path_delay(self, src: str, dst: str) -> float:
        p = self.path(src, dst)
        return sum(self.link(u, v).shape(u, v).delay_s for u, v in zip(p, p[1:]))

    def expected_rtt(self, src: str, dst: str) -> float:
        """Minimum RTT between hosts of two DCs (the same DC when ``src == dst``).

        A LAN's ``delay`` is paid once per delivery across that LAN (see
        ``testbed.network.addressing.lan_shapes``): host -> router and router
        -> host each take it once, so a cross-DC round trip pays each DC's
        LAN delay twice, and a same-DC round trip pays its LAN delay twice.
        """
        if src == dst:
            return 2 * self.dc(src).lan.delay_s
        lan = 2 * (self.dc(src).lan.delay_s + self.dc(dst).lan.delay_s)
        return self.path_delay(src, dst) + self.path_delay(dst, src) + lan

    @property
    def needs_netem(self) -> bool:
        return any(s.needs_netem for lk in self.links for s in (lk.forward, lk.reverse)) or any(
            d.lan.needs_netem for d in self.dcs)

    @property
    def total_hosts(self) -> int:
        return sum(d.hosts for d in self.dcs)

    def scaled(self, factor: float) -> Topology:
        """All WAN rates multiplied by ``factor`` (recorded in ``scale``)."""
        links = tuple(
            WanLink(lk.a, lk.b,
                    lk.forward.with_changes(rate_bps=lk.forward.rate_bps * factor) if lk.forward.rate_bps else lk.forward,
                    lk.reverse.with_changes(rate_bps=lk.reverse.rate_bps * factor) if lk.reverse.rate_bps else lk.reverse)
            for lk in self.links)
        return Topology(self.name, self.dcs, links, self.ps, self.scale * factor, self.description,
                        self.routes, self.switch, self.source)

    def with_link_shape(self, a: str, b: str, **changes: Any) -> Topology:
        """A copy with both directions of link a-b changed (used by sweeps)."""
        links = tuple(WanLink(lk.a, lk.b, lk.forward.with_changes(**changes), lk.reverse.with_changes(**changes))
                      if {lk.a, lk.b} == {a, b} else lk for lk in self.links)
        return Topology(self.name, self.dcs, links, self.ps, self.scale, self.description, self.routes,
                        self.switch, self.source)

    # ------------------------------------------------------------ serialise
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.description:
            d["description"] = self.description
        if self.scale != 1.0:
            d["scale"] = self.scale
        if self.switch != "bridge":
            d["switch"] = self.switch
        dcs = []
        for dc in self.dcs:
            e: dict[str, Any] = {"name": dc.name, "hosts": dc.hosts}
            if dc.lan != DEFAULT_LAN:
                e["lan"] = dc.lan.to_dict()
            if dc.cpu is not None:
                e["cpu"] = dc.cpu
            if dc.label:
                e["label"] = dc.label
            if dc.memory is not None:
                e["memory"] = f"{dc.memory // 2**20}MiB" if dc.memory % 2**20 == 0 else dc.memory
            dcs.append(e)
        d["dcs"] = dcs

        def spec_shape(s: LinkShape) -> dict[str, Any]:
            # Rates are written as in the spec, before ``scale``: from_dict applies it again.
            if s.rate_bps and self.scale != 1.0:
                s = s.with_changes(rate_bps=s.rate_bps / self.scale)
            return s.to_dict()

        links = []
        for lk in self.links:
            if lk.symmetric:
                links.append({"a": lk.a, "b": lk.b, **spec_shape(lk.forward)})
            else:
                links.append({"a": lk.a, "b": lk.b, "forward": spec_shape(lk.forward),
                              "reverse": spec_shape(lk.reverse)})
        d["links"] = links
        if self.ps:
            d["ps"] = self.ps
        if self.routes:
            d["routes"] = {k: list(v) for k, v in self.routes.items()}
        return d


TOP_KEYS = ("name", "description", "scale", "switch", "defaults", "dcs", "links", "ps", "routes")
DC_KEYS = ("name", "hosts", "lan", "cpu", "memory", "label")
DEFAULT_KEYS = ("hosts", "lan", "wan", "cpu", "memory")


_unknown = check_keys


def _mapping(value: Any, field: str, example: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(field, f"expected a mapping, got {type(value).__name__}", f"write e.g. {example}")
    return value


def from_dict(data: Any, source: str = "") -> Topology:
    """Build and validate a :class:`Topology` from its spec mapping (YAML/JSON form)."""
    data = _mapping(data, "topology", "{name: x, dcs: [...], links: [...]}")
    _unknown(data, TOP_KEYS, "")
    name = data.get("name") or (source.rsplit("/", 1)[-1].split(".")[0] if source else "topology")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValidationError("name", f"bad topology name {name!r}", "use letters, digits, '_', '-', '.'")
    defaults = _mapping(data.get("defaults", {}), "defaults", "{hosts: 2, wan: {rate: 1Gbit}}")
    _unknown(defaults, DEFAULT_KEYS, "defaults")
    scale = data.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1000:
        raise ValidationError("scale", f"scale must be a positive number, got {scale!r}",
                              "e.g. scale: 0.1 shrinks every WAN rate to a tenth")
    switch = data.get("switch", "bridge")
    if switch not in ("bridge", "ovs"):
        raise ValidationError("switch", f"unknown switch kind {switch!r}", "use 'bridge' (default) or 'ovs'")

    # ---------------------------------------------------------------- DCs
    raw_dcs = data.get("dcs")
    if not isinstance(raw_dcs, list) or not raw_dcs:
        raise ValidationError("dcs", "a topology needs a non-empty list of data centers",
                              "write dcs: [{name: east, hosts: 2}, {name: west, hosts: 2}]")
    if len(raw_dcs) > MAX_DCS:
        raise ValidationError("dcs", f"{len(raw_dcs)} data centers; at most {MAX_DCS} are addressable "
                              "(each DC's LAN is 10.<i>.0.0/24)", f"use at most {MAX_DCS} DCs")
    dcs: list[DataCenter] = []
    seen: set[str] = set()
    default_lan = defaults.get("lan")
    for i, raw in enumerate(raw_dcs):
        f = f"dcs[{i}]"
        if isinstance(raw, str):
            raw = {"name": raw}
        raw = _mapping(raw, f, "{name: east, hosts: 2}")
        _unknown(raw, DC_KEYS, f)
        nm = check_name(raw.get("name"), f"{f}.name")
        if nm in seen:
            raise ValidationError(f"{f}.name", f"duplicate data center {nm!r}", "give every DC a unique name")
        seen.add(nm)
        hosts = raw.get("hosts", defaults.get("hosts", 2))
        if isinstance(hosts, bool) or not isinstance(hosts, int) or not 0 <= hosts <= MAX_HOSTS_PER_DC:
            raise ValidationError(f"{f}.hosts", f"hosts must be an integer in 0..{MAX_HOSTS_PER_DC}, got {hosts!r}",
                                  "e.g. hosts: 2")
        lan_raw = raw.get("lan", default_lan)
        lan = DEFAULT_LAN if lan_raw is None else LinkShape(**parse_shape_fields(lan_raw, f"{f}.lan"))
        cpu = raw.get("cpu", defaults.get("cpu"))
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not 0 < cpu <= 64):
            raise ValidationError(f"{f}.cpu", f"cpu share must be a positive fraction of a core, got {cpu!r}",
                                  "e.g. cpu: 0.5 gives each host half a core")
        memory = raw.get("memory", defaults.get("memory"))
        if memory is not None:
            memory = parse_size(memory, f"{f}.memory")
            if not MIN_MEMORY <= memory <= MAX_MEMORY:
                raise ValidationError(f"{f}.memory", f"memory limit per host must be in 16MiB..1TiB, got {memory} bytes",
                                      "e.g. memory: 2GiB (a trainer with torch needs a few hundred MiB)")
        label = raw.get("label", "")
        if not isinstance(label, str):
            raise ValidationError(f"{f}.label", "label must be text", "e.g. label: 'us-east-1'")
        dcs.append(DataCenter(nm, hosts, lan, None if cpu is None else float(cpu), label, memory))

    # -------------------------------------------------------------- links
    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        raise ValidationError("links", "expected a list of links", "write links: [{a: east, b: west, rate: 1Gbit}]")
    if len(raw_links) > MAX_LINKS:
        raise ValidationError("links", f"{len(raw_links)} links; at most {MAX_LINKS} are addressable "
                              "(each link is 10.255.<k>.0/30)", f"use at most {MAX_LINKS} links")
    if len(dcs) > 1 and not raw_links:
        raise ValidationError("links", f"{len(dcs)} data centers but no WAN links",
                              "join the DCs with links: [{a: ..., b: ..., rate: ..., delay: ...}]")
    wan_default = defaults.get("wan", {})
    wan_default = _mapping(wan_default, "defaults.wan", "{rate: 1Gbit, delay: 10ms}")
    links: list[WanLink] = []
    pairs: set[frozenset[str]] = set()
    for i, raw in enumerate(raw_links):
        f = f"links[{i}]"
        raw = _mapping(raw, f, "{a: east, b: west, rate: 1Gbit, delay: 10ms}")
        allowed = ("a", "b", "forward", "reverse", *SHAPE_KEYS)
        _unknown(raw, allowed, f)
        ends = []
        for end in ("a", "b"):
            if end not in raw:
                raise ValidationError(f"{f}.{end}", "missing link endpoint", "name the two DCs with a: and b:")
            if not isinstance(raw[end], str) or raw[end] not in seen:
                raise ValidationError(f"{f}.{end}", f"no data center named {raw[end]!r}",
                                      f"name one DC by its name, one of: {', '.join(sorted(seen))}")
            ends.append(raw[end])
        a, b = ends
        if a == b:
            raise ValidationError(f"{f}.b", f"link from {a!r} to itself", "join two different DCs")
        if frozenset((a, b)) in pairs:
            raise ValidationError(f, f"duplicate link between {a!r} and {b!r}",
                                  "one link per DC pair; use forward:/reverse: for asymmetric shapes")
        pairs.add(frozenset((a, b)))
        common = {**wan_default, **{k: v for k, v in raw.items() if k in SHAPE_KEYS}}
        if "rtt" in common and "delay" in common:
            if "rtt" in raw and "delay" not in raw:
                common.pop("delay")
            elif "delay" in raw and "rtt" not in raw:
                common.pop("rtt")
        shapes = []
        for side in ("forward", "reverse"):
            per = raw.get(side, {})
            per = _mapping(per, f"{f}.{side}", "{rate: 100Mbit, delay: 10ms}")
            merged = {**common, **per}
            if "rtt" in per and "delay" in merged and "delay" not in per:
                merged.pop("delay")
            if "delay" in per and "rtt" in merged and "rtt" not in per:
                merged.pop("rtt")
            where = f"{f}.{side}" if side in raw else f
            shapes.append(LinkShape(**parse_shape_fields(merged, where)))
        links.append(WanLink(a, b, shapes[0], shapes[1]))

    # ------------------------------------------------------- connectivity
    g = nx.Graph()
    g.add_nodes_from(seen)
    g.add_edges_from((lk.a, lk.b) for lk in links)
    if not nx.is_connected(g):
        parts = sorted(sorted(c) for c in nx.connected_components(g))
        raise ValidationError("links", f"the WAN graph is disconnected: {parts}",
                              "add links so that every DC can reach every other (directly or relayed)")

    ps = data.get("ps")
    if ps is not None and (not isinstance(ps, str) or ps not in seen):
        raise ValidationError("ps", f"no data center named {ps!r} for the parameter server",
                              f"use one of: {', '.join(sorted(seen))}")

    routes: dict[str, tuple[str, ...]] = {}
    raw_routes = _mapping(data.get("routes", {}) or {}, "routes", "{'a->c': [a, b, c]}")
    adj = {frozenset((lk.a, lk.b)) for lk in links}
    for key, path in raw_routes.items():
        f = f"routes[{key!r}]"
        m = re.fullmatch(r"([a-z0-9]+)->([a-z0-9]+)", str(key))
        if not m or m.group(1) not in seen or m.group(2) not in seen:
            raise ValidationError(f, "route keys are 'SRC->DST' with existing DC names", "e.g. 'east->west'")
        if not isinstance(path, list) or len(path) < 2 or not all(isinstance(x, str) for x in path) \
                or path[0] != m.group(1) or path[-1] != m.group(2):
            raise ValidationError(f, "a route is the list of DCs from SRC to DST", f"e.g. [{m.group(1)}, ..., {m.group(2)}]")
        if len(set(path)) != len(path):
            raise ValidationError(f, "route visits a DC twice", "give a loop-free path")
        for u, v in zip(path, path[1:]):
            if frozenset((u, v)) not in adj:
                raise ValidationError(f, f"no link between {u!r} and {v!r}", "routes may only use existing links")
        routes[str(key)] = tuple(path)

    topo = Topology(name, tuple(dcs), tuple(links), ps, 1.0, str(data.get("description", "")), routes, switch, source)
    # Routing is per destination at every router: a pinned route only fixes the
    # first hop, so its later hops must agree with what the routers on it do,
    # or packets take another path (or loop).
    for key, pinned in routes.items():
        src, dst = key.split("->")
        f = f"routes[{key!r}]"
        try:
            taken = topo.path(src, dst)
        except ValidationError as e:
            raise ValidationError(f, e.problem, e.fix) from None
        if tuple(taken) != pinned:
            i = next(k for k in range(len(taken)) if taken[k] != pinned[k]) - 1
            here = pinned[i]
            raise ValidationError(f, f"packets would take {'-'.join(taken)}, not the pinned {'-'.join(pinned)}: "
                                     f"the router in {here!r} forwards traffic for {dst!r} to {taken[i + 1]!r}",
                                  f"also pin '{here}->{dst}': {list(pinned[i:])}")
    if scale != 1.0:
        topo = topo.scaled(float(scale))
    return topo
