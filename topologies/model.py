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
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import networkx as nx
from pydantic import BeforeValidator

from traffic_control.errors import ValidationError
from traffic_control.fields import Size, SpecModel, unit_field, validate
from traffic_control.shape import LinkShape, ShapeSpec, shape_kwargs

#: Longest DC name: ``tb-<dc>-<port>`` (bridge port names) must fit in 15 bytes.
MAX_DC_NAME = 8
MAX_HOSTS_PER_DC = 64
#: Address plan limits (testbed.network.addressing): DC i owns 10.i.0.0/24, link k 10.255.k.0/30.
MAX_DCS = 250
MAX_LINKS = 250
#: The image of ``runtime: docker`` hosts unless the spec names one (``testbed image build`` makes it).
DEFAULT_DOCKER_IMAGE = "geo-testbed/trainer:latest"
MAX_GPUS_PER_HOST = 64
#: bounds of a host's ``memory:`` limit (bytes)
MIN_MEMORY, MAX_MEMORY = 16 * 2**20, 2**40
_NAME_RE = re.compile(r"[a-z][a-z0-9]*")

DEFAULT_LAN = LinkShape()  # unshaped unless the spec says otherwise
#: The hosts' TCP congestion control unless the spec says otherwise: Linux's default, set explicitly so
#: that a machine whose own default differs (BBR here) does not change the results silently.
DEFAULT_CONGESTION_CONTROL = "cubic"
#: Ceiling of TCP's buffer autotuning per socket (``tcp_rmem``/``tcp_wmem`` max) unless the spec says otherwise:
#: enough for 2 Gbit/s x 250 ms, so a window is never what limits a WAN flow unless a spec asks for it.
DEFAULT_TCP_BUFFER = 64 * 2**20
#: Linux's initial buffer (the middle value of tcp_rmem/tcp_wmem), capped by a smaller maximum.
TCP_BUFFER_DEFAULT, MIN_TCP_BUFFER, MAX_TCP_BUFFER = 131072, 4096, 2**30


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
    congestion_control: str = "cubic"  # TCP congestion control of every host of the DC (README "TCP")
    receive_buffer: int = DEFAULT_TCP_BUFFER  # bytes: the ceiling of each socket's receive buffer (tcp_rmem max)
    send_buffer: int = DEFAULT_TCP_BUFFER  # bytes: the ceiling of each socket's send buffer (tcp_wmem max)
    runtime: str = "process"  # process: a Mininet host; docker: a container (testbed.network.docker_hosts)
    image: str | None = None  # runtime docker: the image (None: the testbed's own, `testbed image build`)
    volumes: tuple[str, ...] = ()  # runtime docker: extra bind mounts "SRC:DST[:ro]"
    env: tuple[tuple[str, str], ...] = ()  # runtime docker: environment of the trainers
    gpus: int | tuple[int, ...] | None = None  # per host: a count (assigned without overlap) or device indices

    def runtime_spec(self) -> dict[str, Any]:
        """The DC's runtime keys in spec form (empty for process hosts)."""
        if self.runtime == "process":
            return {}
        out: dict[str, Any] = {"runtime": self.runtime}
        if self.image:
            out["image"] = self.image
        if self.volumes:
            out["volumes"] = list(self.volumes)
        if self.env:
            out["env"] = dict(self.env)
        return out

    def gpu_spec(self) -> dict[str, Any]:
        return {} if self.gpus is None else {"gpus": list(self.gpus) if isinstance(self.gpus, tuple) else self.gpus}

    def tcp_spec(self) -> dict[str, Any]:
        """The DC's ``tcp:`` section in spec form (only what differs from the defaults)."""
        out: dict[str, Any] = {}
        if self.congestion_control != DEFAULT_CONGESTION_CONTROL:
            out["congestion_control"] = self.congestion_control
        for key in ("receive_buffer", "send_buffer"):
            v = getattr(self, key)
            if v != DEFAULT_TCP_BUFFER:
                out[key] = f"{v // 1024}KiB" if v % 1024 == 0 else v
        return out

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
    #: True: hosts hand the kernel GSO super-packets (up to 64 KiB) as Linux does by default; False (the
    #: default): every emulated interface sends wire-sized packets, so a queue limit in packets holds the
    #: packets it was sized for (README "Queues").
    gso: bool = False
    gpu_sharing: bool = False  # hosts may share a GPU (testbed.network.gpus)

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
            g.add_node(d.name, hosts=d.hosts, lan_rate_bps=d.lan.rate_bps, lan_delay_s=d.lan.delay_s, lan_mtu=d.lan.mtu)
        for lk in self.links:
            # mtu: what TCP flows crossing the link get (their MSS comes from the end DCs' LANs too)
            mtu = min(lk.forward.mtu, self.dc(lk.a).lan.mtu, self.dc(lk.b).lan.mtu)
            for (u, v), s in (((lk.a, lk.b), lk.forward), ((lk.b, lk.a), lk.reverse)):
                g.add_edge(u, v, rate_bps=s.rate_bps if s.rate_bps else float("inf"),
                           delay_s=s.delay_s, jitter_s=s.jitter_s, loss_pct=s.loss_pct, mtu=mtu)
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

    def queue_rtts(self, delays: dict[tuple[str, str], float] | None = None) -> dict[tuple[str, str], float]:
        """The round trip each link direction's queue is sized for: the longest RTT among the DC pairs
        whose packets (data one way, ACKs the other) cross it.

        A queue in front of a bottleneck needs about one bandwidth x round-trip of the *flows through
        it* for a loss-based TCP to keep the link busy; sizing it from the link's own delay starves a
        short first hop of a long relayed path (a 1 ms hop on a 60 ms path got a tenth of a BDP).
        Keys ``(u, v)`` for every link direction that some route uses; a direction no route crosses is
        absent.  Also ``(dc, dc)``: the longest RTT from that DC's hosts (its LAN queues).

        ``delays``: one-way delay per link direction ``(u, v)`` in place of the spec's (a running network
        whose delays were changed; its routes stay the ones built from the spec).
        """
        paths = {(s, d): self.path(s, d) for s in self.dc_names for d in self.dc_names if s != d}

        def delay(u: str, v: str) -> float:
            return delays[(u, v)] if delays and (u, v) in delays else self.link(u, v).shape(u, v).delay_s

        one_way = {k: sum(delay(u, v) for u, v in zip(p, p[1:])) for k, p in paths.items()}
        out: dict[tuple[str, str], float] = {(d.name, d.name): 2 * d.lan.delay_s for d in self.dcs}
        for (s, d), p in paths.items():
            rtt = one_way[(s, d)] + one_way[(d, s)] + 2 * (self.dc(s).lan.delay_s + self.dc(d).lan.delay_s)
            for edge in [*zip(p, p[1:]), (s, s), (d, d)]:
                out[edge] = max(out.get(edge, 0.0), rtt)
        return out

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
        return replace(self, links=links, scale=self.scale * factor)

    def with_link_shape(self, a: str, b: str, **changes: Any) -> Topology:
        """A copy with both directions of link a-b changed (used by sweeps)."""
        links = tuple(WanLink(lk.a, lk.b, lk.forward.with_changes(**changes), lk.reverse.with_changes(**changes))
                      if {lk.a, lk.b} == {a, b} else lk for lk in self.links)
        return replace(self, links=links)

    # ------------------------------------------------------------ serialise
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.description:
            d["description"] = self.description
        if self.scale != 1.0:
            d["scale"] = self.scale
        if self.switch != "bridge":
            d["switch"] = self.switch
        if self.gso:
            d["gso"] = True
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
            if dc.tcp_spec():
                e["tcp"] = dc.tcp_spec()
            e.update(dc.runtime_spec())
            e.update(dc.gpu_spec())
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
        if self.gpu_sharing:
            d["gpu_sharing"] = True
        return d


def _dc_name(value: Any, info: Any) -> Any:
    return check_name(value, info.field_name)


DcName = Annotated[str, BeforeValidator(_dc_name)]


def _dc_shorthand(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class _DcItemSchema:
    """JSON Schema of a ``dcs`` entry: a bare name, or the mapping."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: Any) -> dict[str, Any]:
        return {"anyOf": [{"type": "string", "pattern": _NAME_RE.pattern, "maxLength": MAX_DC_NAME},
                          handler(core)]}


class TcpSpec(SpecModel):
    """The transport of a DC's hosts."""

    congestion_control: str | None = unit_field(None, pattern=r"^[a-z0-9_]{1,15}$",
                                                fix="e.g. congestion_control: cubic (or bbr, reno)")
    """TCP congestion control of every host (default cubic, Linux's own default)"""
    receive_buffer: Size | None = unit_field(None, ge=MIN_TCP_BUFFER, le=MAX_TCP_BUFFER,
                                             fix="e.g. receive_buffer: 256KiB (default 64MiB)")
    """ceiling of each socket's receive buffer (tcp_rmem max; the advertised window is about half of it)"""
    send_buffer: Size | None = unit_field(None, ge=MIN_TCP_BUFFER, le=MAX_TCP_BUFFER,
                                          fix="e.g. send_buffer: 256KiB (default 64MiB)")
    """ceiling of each socket's send buffer (tcp_wmem max)"""


class DataCenterSpec(SpecModel):
    """A data center: ``hosts`` trainer hosts on a LAN behind one router."""

    name: DcName = unit_field(..., fix="use lower-case letters and digits, e.g. 'virginia'")
    """short name (a-z, 0-9, at most 8 bytes: it becomes part of interface names)"""
    hosts: int | None = unit_field(None, ge=0, le=MAX_HOSTS_PER_DC, fix="e.g. hosts: 2")
    """trainer hosts (default: defaults.hosts, else 2)"""
    lan: ShapeSpec | None = unit_field(fix="e.g. lan: {rate: 1Gbit}")
    """LAN shape (host <-> switch); unshaped if absent"""
    cpu: float | None = unit_field(None, gt=0, le=64, fix="e.g. cpu: 0.5 gives each host half a core")
    """CPU share per host, in cores (cgroup)"""
    memory: Size | None = unit_field(None, ge=MIN_MEMORY, le=MAX_MEMORY,
                                     fix="e.g. memory: 2GiB (a trainer with torch needs a few hundred MiB)")
    """memory limit per host (cgroup; past it the OOM killer acts, named in the trial's reason)"""
    label: str = unit_field("", fix="e.g. label: 'us-east-1'")
    """free text shown in reports (a region name)"""
    tcp: TcpSpec | None = unit_field(fix="e.g. tcp: {congestion_control: bbr}")
    """the hosts' transport (default: defaults.tcp, else cubic)"""
    runtime: Literal["process", "docker"] | None = unit_field(
        None, fix="runtime: process (a Mininet host, the default) or runtime: docker (a container)")
    """what a host is: a Mininet process host (default) or a Docker container on the emulated LAN"""
    image: str | None = unit_field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_./:@-]*$",
                                   fix=f"e.g. image: {DEFAULT_DOCKER_IMAGE} (with runtime: docker)")
    """runtime docker: the hosts' image, with Python and torch (default: the testbed's, `testbed image build`)"""
    volumes: list[str] | None = unit_field(None, fix="e.g. volumes: ['/data:/data:ro'] (absolute paths)")
    """runtime docker: extra bind mounts SRC:DST[:ro|:rw]"""
    env: dict[str, str] | None = unit_field(None, fix="e.g. env: {NCCL_DEBUG: INFO}")
    """runtime docker: environment variables of the trainers"""
    gpus: int | list[int] | None = unit_field(
        None, fix="e.g. gpus: 1 (each host one GPU, assigned without overlap) or gpus: [0, 1] (device indices)")
    """GPUs per host: a count the testbed assigns without overlap, or device indices (every host of the DC
    gets them: with several hosts that is sharing, see gpu_sharing)"""


class DefaultsSpec(SpecModel):
    """Values every DC and link takes unless it says otherwise."""

    hosts: int | None = unit_field(None, ge=0, le=MAX_HOSTS_PER_DC, fix="e.g. hosts: 2")
    lan: ShapeSpec | None = unit_field(fix="e.g. lan: {rate: 1Gbit}")
    wan: ShapeSpec = unit_field(default_factory=ShapeSpec, fix="e.g. wan: {rate: 1Gbit, delay: 10ms}")
    cpu: float | None = unit_field(None, gt=0, le=64, fix="e.g. cpu: 0.5")
    memory: Size | None = unit_field(None, ge=MIN_MEMORY, le=MAX_MEMORY, fix="e.g. memory: 2GiB")
    tcp: TcpSpec | None = unit_field(fix="e.g. tcp: {congestion_control: bbr}")
    runtime: Literal["process", "docker"] | None = unit_field(None, fix="runtime: process or runtime: docker")
    image: str | None = unit_field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_./:@-]*$",
                                   fix=f"e.g. image: {DEFAULT_DOCKER_IMAGE}")
    volumes: list[str] | None = unit_field(None, fix="e.g. volumes: ['/data:/data:ro']")
    env: dict[str, str] | None = unit_field(None, fix="e.g. env: {NCCL_DEBUG: INFO}")
    gpus: int | list[int] | None = unit_field(None, fix="e.g. gpus: 1")


class LinkSpec(ShapeSpec):
    """A WAN link between two DCs' routers: one shape for both directions, or per direction."""

    a: str = unit_field(..., fix="name the two DCs with a: and b:")
    b: str = unit_field(..., fix="name the two DCs with a: and b:")
    forward: ShapeSpec | None = unit_field(fix="e.g. forward: {rate: 200Mbit, delay: 10ms}")
    """shape a -> b (over the link's own keys)"""
    reverse: ShapeSpec | None = unit_field(fix="e.g. reverse: {rate: 50Mbit, rtt: 30ms}")
    """shape b -> a"""

    def common(self) -> dict[str, Any]:
        own = set(ShapeSpec.model_fields)
        return {k: v for k, v in self.given().items() if k in own}


class TopologySpec(SpecModel):
    """A multi-datacenter topology (README "Writing a topology")."""

    name: str | None = unit_field(None, pattern=r"^[A-Za-z0-9_.-]+$", fix="use letters, digits, '_', '-', '.'")
    """name (default: the file name)"""
    description: str = ""
    scale: float = unit_field(1.0, gt=0, le=1000, fix="e.g. scale: 0.1 shrinks every WAN rate to a tenth")
    """multiplies every WAN rate (latencies never scale); recorded everywhere"""
    switch: Literal["bridge", "ovs"] = unit_field("bridge", fix="use 'bridge' (default) or 'ovs'")
    """DC switch: a Linux bridge (no controller, no OVS) or Open vSwitch"""
    gso: bool = unit_field(False, fix="gso: false (default: wire-sized packets) or gso: true")
    """hosts send GSO super-packets (Linux's default): needed past ~1 Gbit/s per flow on a small machine, but
    then a queue limit in packets holds up to 43 x the bytes it was sized for (README "Queues")"""
    defaults: DefaultsSpec = unit_field(default_factory=DefaultsSpec, fix="e.g. defaults: {hosts: 2, wan: {rate: 1Gbit}}")
    dcs: list[Annotated[DataCenterSpec, BeforeValidator(_dc_shorthand), _DcItemSchema]] = unit_field(
        ..., min_length=1, max_length=MAX_DCS, fix="write dcs: [{name: east, hosts: 2}, {name: west, hosts: 2}]")
    """the data centers (a bare name is a DC with the defaults)"""
    links: list[LinkSpec] = unit_field(default_factory=list, max_length=MAX_LINKS,
                                       fix="write links: [{a: east, b: west, rate: 1Gbit, delay: 10ms}]")
    """WAN links; the graph must be connected (DCs without a link are relayed)"""
    ps: str | None = unit_field(None, fix="name a DC")
    """DC of the parameter-server host"""
    routes: dict[str, list[str]] = unit_field(default_factory=dict, fix="e.g. {'a->c': [a, b, c]}")
    """pinned routes 'SRC->DST': [SRC, ..., DST] (the first hop; later hops must agree)"""
    gpu_sharing: bool = unit_field(False, fix="gpu_sharing: true lets hosts share a GPU (default false)")
    """hosts may share a GPU (more hosts' GPUs than the machine has, or one index given to several hosts)"""


TOP_KEYS = tuple(TopologySpec.model_fields)
DC_KEYS = tuple(DataCenterSpec.model_fields)
DEFAULT_KEYS = tuple(DefaultsSpec.model_fields)


def _runtime(raw: DataCenterSpec, defaults: DefaultsSpec, f: str) -> dict[str, Any]:
    """A DC's runtime keys (its own over the defaults), checked together: image, volumes and env belong
    to runtime docker."""
    def pick(key: str) -> tuple[Any, str]:
        own = getattr(raw, key)
        return (own, f"{f}.{key}") if own is not None else (getattr(defaults, key), f"defaults.{key}")

    runtime, _ = pick("runtime")
    runtime = runtime or "process"
    out: dict[str, Any] = {"runtime": runtime}
    for key in ("image", "volumes", "env"):
        value, where = pick(key)
        if value is None:
            continue
        if runtime != "docker":
            raise ValidationError(where, f"{key} is given but the DC's hosts are process hosts",
                                  "add runtime: docker to the DC (or defaults), or remove the key")
        out[key] = value
    for i, v in enumerate(out.get("volumes") or []):
        parts = v.split(":")
        where = f"{pick('volumes')[1]}[{i}]"
        if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]) \
                or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ValidationError(where, f"bad volume {v!r}", "write SRC:DST or SRC:DST:ro with absolute paths, "
                                  "e.g. /data/imagenet:/data:ro")
    if "volumes" in out:
        out["volumes"] = tuple(out["volumes"])
    if "env" in out:
        out["env"] = tuple(sorted((str(k), str(v)) for k, v in out["env"].items()))
    return out


def from_dict(data: Any, source: str = "") -> Topology:
    """Build and validate a :class:`Topology` from its spec mapping (YAML/JSON form)."""
    if not isinstance(data, dict):
        raise ValidationError("topology", f"expected a mapping, got {type(data).__name__}",
                              "write e.g. {name: x, dcs: [...], links: [...]}")
    spec = validate(TopologySpec, data)
    name = spec.name or (source.rsplit("/", 1)[-1].split(".")[0] if source else "topology")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValidationError("name", f"bad topology name {name!r}", "use letters, digits, '_', '-', '.'")
    defaults = spec.defaults

    # ---------------------------------------------------------------- DCs
    dcs: list[DataCenter] = []
    seen: set[str] = set()
    for i, raw in enumerate(spec.dcs):
        f = f"dcs[{i}]"
        if raw.name in seen:
            raise ValidationError(f"{f}.name", f"duplicate data center {raw.name!r}", "give every DC a unique name")
        seen.add(raw.name)
        hosts = raw.hosts if raw.hosts is not None else (defaults.hosts if defaults.hosts is not None else 2)
        lan_spec = raw.lan if "lan" in raw.model_fields_set else defaults.lan
        where = f"{f}.lan" if "lan" in raw.model_fields_set else "defaults.lan"
        lan = DEFAULT_LAN if lan_spec is None else _shape(lan_spec.given(), where)
        cpu = raw.cpu if raw.cpu is not None else defaults.cpu
        memory = raw.memory if raw.memory is not None else defaults.memory
        cc = next((t.congestion_control for t in (raw.tcp, defaults.tcp) if t is not None and t.congestion_control),
                  DEFAULT_CONGESTION_CONTROL)
        bufs = [next((int(getattr(t, key)) for t in (raw.tcp, defaults.tcp) if t is not None and getattr(t, key)),
                     DEFAULT_TCP_BUFFER) for key in ("receive_buffer", "send_buffer")]
        gpus = raw.gpus if raw.gpus is not None else defaults.gpus
        where = f"{f}.gpus" if raw.gpus is not None else "defaults.gpus"
        if isinstance(gpus, int) and not 0 <= gpus <= MAX_GPUS_PER_HOST:
            raise ValidationError(where, f"{gpus} GPUs per host", f"a count from 0 to {MAX_GPUS_PER_HOST}, e.g. gpus: 1")
        if isinstance(gpus, list) and (not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0):
            raise ValidationError(where, f"device indices {gpus}", "distinct indices >= 0, e.g. gpus: [0, 1]")
        dcs.append(DataCenter(raw.name, hosts, lan, None if cpu is None else float(cpu), raw.label, memory, cc,
                              *bufs, **_runtime(raw, defaults, f),
                              gpus=tuple(gpus) if isinstance(gpus, list) else gpus))

    # -------------------------------------------------------------- links
    if len(dcs) > 1 and not spec.links:
        raise ValidationError("links", f"{len(dcs)} data centers but no WAN links",
                              "join the DCs with links: [{a: ..., b: ..., rate: ..., delay: ...}]")
    wan_default = defaults.wan.given()
    links: list[WanLink] = []
    pairs: set[frozenset[str]] = set()
    for i, raw_link in enumerate(spec.links):
        f = f"links[{i}]"
        for end in ("a", "b"):
            if getattr(raw_link, end) not in seen:
                raise ValidationError(f"{f}.{end}", f"no data center named {getattr(raw_link, end)!r}",
                                      f"name one DC by its name, one of: {', '.join(sorted(seen))}")
        a, b = raw_link.a, raw_link.b
        if a == b:
            raise ValidationError(f"{f}.b", f"link from {a!r} to itself", "join two different DCs")
        if frozenset((a, b)) in pairs:
            raise ValidationError(f, f"duplicate link between {a!r} and {b!r}",
                                  "one link per DC pair; use forward:/reverse: for asymmetric shapes")
        pairs.add(frozenset((a, b)))
        own = raw_link.common()
        common = {**wan_default, **own}
        if "rtt" in common and "delay" in common:  # the link's own choice wins over the default's
            common.pop("delay" if "rtt" in own else "rtt")
        shapes = []
        for side in ("forward", "reverse"):
            per_spec = getattr(raw_link, side)
            per = per_spec.given() if per_spec is not None else {}
            merged = {**common, **per}
            if "rtt" in per and "delay" in merged and "delay" not in per:
                merged.pop("delay")
            if "delay" in per and "rtt" in merged and "rtt" not in per:
                merged.pop("rtt")
            shapes.append(_shape(merged, f"{f}.{side}" if per_spec is not None else f))
        if shapes[0].mtu != shapes[1].mtu:
            raise ValidationError(f"{f}.reverse.mtu", f"forward mtu {shapes[0].mtu} and reverse mtu {shapes[1].mtu} "
                                  "differ", "a link has one MTU (both ends of its interface pair): give mtu once "
                                  "on the link")
        links.append(WanLink(a, b, shapes[0], shapes[1]))

    # ------------------------------------------------------- connectivity
    g = nx.Graph()
    g.add_nodes_from(seen)
    g.add_edges_from((lk.a, lk.b) for lk in links)
    if not nx.is_connected(g):
        parts = sorted(sorted(c) for c in nx.connected_components(g))
        raise ValidationError("links", f"the WAN graph is disconnected: {parts}",
                              "add links so that every DC can reach every other (directly or relayed)")

    ps = spec.ps
    if ps is not None and ps not in seen:
        raise ValidationError("ps", f"no data center named {ps!r} for the parameter server",
                              f"use one of: {', '.join(sorted(seen))}")

    routes: dict[str, tuple[str, ...]] = {}
    raw_routes = spec.routes
    adj = {frozenset((lk.a, lk.b)) for lk in links}
    for key, path in raw_routes.items():
        f = f"routes[{key!r}]"
        m = re.fullmatch(r"([a-z0-9]+)->([a-z0-9]+)", str(key))
        if not m or m.group(1) not in seen or m.group(2) not in seen:
            raise ValidationError(f, "route keys are 'SRC->DST' with existing DC names", "e.g. 'east->west'")
        if len(path) < 2 or path[0] != m.group(1) or path[-1] != m.group(2):
            raise ValidationError(f, "a route is the list of DCs from SRC to DST", f"e.g. [{m.group(1)}, ..., {m.group(2)}]")
        if len(set(path)) != len(path):
            raise ValidationError(f, "route visits a DC twice", "give a loop-free path")
        for u, v in zip(path, path[1:]):
            if frozenset((u, v)) not in adj:
                raise ValidationError(f, f"no link between {u!r} and {v!r}", "routes may only use existing links")
        routes[str(key)] = tuple(path)

    topo = Topology(name, tuple(dcs), tuple(links), ps, 1.0, spec.description, routes, spec.switch, source,
                    bool(spec.gso), bool(spec.gpu_sharing))
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
    if spec.scale != 1.0:
        topo = topo.scaled(float(spec.scale))
    return topo


def _shape(given: dict[str, Any], field: str) -> LinkShape:
    """A LinkShape from merged spec keys; the shape's own checks named under ``field``."""
    try:
        return LinkShape(**shape_kwargs(given))
    except ValidationError as e:
        raise e.under(field) from None
