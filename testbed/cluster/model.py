"""The cluster file: the servers a topology is spread over, and how.

A cluster file is separate from the topology and the experiment so that the same topology runs on one
machine or on several without being edited::

    mode: emulate              # emulate: hosts emulated on every server; shape: servers are the hosts
    launcher: s1               # the server `testbed` runs on (default: the first)
    servers:
      - {name: s1, address: 10.0.0.1}
      - {name: s2, address: 10.0.0.2, user: ubuntu, gpus: 8, max_hosts: 16}
    placement: auto            # or {east: s1, central: s2, west: s2}

Every check of the file is here; errors name the field (``servers[1].address``) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from traffic_control.errors import ValidationError
from traffic_control.fields import SpecModel, unit_field, validate

_SERVER_NAME = r"^[a-z][a-z0-9-]{0,30}$"
#: an IPv4/IPv6 address or a DNS name (what ssh accepts as a host)
_ADDRESS = r"^[A-Za-z0-9][A-Za-z0-9.:_-]*$"
_USER = r"^[a-z_][a-z0-9_.-]{0,31}$"
#: The least a measured server counts for in an automatic placement, in cores (:attr:`Server.free`).
MIN_FREE = 0.1


class ServerSpec(SpecModel):
    """One server, reached over SSH."""

    name: str = unit_field(..., pattern=_SERVER_NAME, fix="lower-case letters, digits and '-', e.g. 'gpu1'")
    """the server's name in placement and records"""
    address: str = unit_field(..., pattern=_ADDRESS, fix="an IP address or a host name ssh can reach, "
                                                         "e.g. 10.0.0.2")
    """where ssh reaches it (the launcher's own address for the launcher)"""
    user: str = unit_field("root", pattern=_USER, fix="a login name, e.g. user: ubuntu")
    """SSH user; the testbed needs root on every server (sudo -n is used when the user is not root)"""
    port: int = unit_field(22, ge=1, le=65535, fix="e.g. port: 22")
    """SSH port"""
    identity: str | None = unit_field(None, fix="a private key file, e.g. identity: ~/.ssh/id_ed25519")
    """private key for this server (default: ssh's own choice, e.g. the agent)"""
    python: str = unit_field("python3", pattern=r"^[A-Za-z0-9_./-]+$",
                             fix="the interpreter on the server, e.g. python: /opt/testbed-venv/bin/python")
    """Python on the server (the testbed's venv there, for runs)"""
    checkout: str | None = unit_field(None, pattern=r"^/", fix="an absolute path, e.g. checkout: /srv/geo-testbed")
    """the testbed's checkout on the server (default: the same path as the launcher's)"""
    gpus: int | None = unit_field(None, ge=0, le=64, fix="the number of GPUs on the server, e.g. gpus: 8")
    """GPUs on the server (placement refuses DCs whose hosts ask for more)"""
    max_hosts: int | None = unit_field(None, ge=1, le=4096, fix="e.g. max_hosts: 16")
    """most emulated nodes (hosts, routers, parameter servers) the server may hold"""
    cpus: int | None = unit_field(None, ge=1, le=4096, fix="the cores the testbed may use there, e.g. cpus: 32")
    """cores for the server's emulated nodes: automatic placement balances nodes per core (default: measured
    over ssh, ``nproc``, when a network is built; ``testbed cluster place --measure`` shows it)"""


class ClusterSpec(SpecModel):
    """Several servers sharing one topology (README "Several servers")."""

    mode: Literal["emulate", "shape"] = unit_field("emulate", fix="mode: emulate or mode: shape")
    """emulate: every server emulates its DCs' hosts and routers, WAN links between servers are tunnels;
    shape: no emulated hosts, each server's real egress is shaped per destination DC"""
    servers: list[ServerSpec] = unit_field(..., min_length=1, max_length=64,
                                           fix="write servers: [{name: s1, address: 10.0.0.1}, ...]")
    """the servers"""
    launcher: str | None = unit_field(None, fix="name one of the servers")
    """the server the testbed is started on (default: the first)"""
    placement: Literal["auto"] | dict[str, str] = unit_field(
        "auto", fix="placement: auto, or a mapping of every DC to a server, e.g. {east: s1, west: s2}")
    """DC -> server, or auto"""
    known_hosts: str | None = unit_field(None, fix="a known_hosts file, e.g. known_hosts: ~/.ssh/known_hosts")
    """the servers' host keys (default: ssh's own file; an unknown key is accepted once and then pinned)"""
    connect_timeout: float = unit_field(10.0, gt=0, le=300, fix="seconds, e.g. connect_timeout: 10")
    """seconds to wait for a server's SSH connection"""


@dataclass(frozen=True)
class Server:
    name: str
    address: str
    user: str = "root"
    port: int = 22
    identity: str | None = None
    python: str = "python3"
    checkout: str | None = None
    gpus: int | None = None
    max_hosts: int | None = None
    cpus: int | None = None
    #: cores' worth of CPU other jobs used there when its cores were measured (testbed.cluster.capacity); None
    #: where not measured (a given ``cpus:`` is the testbed's alone)
    busy: float | None = None

    @property
    def free(self) -> float | None:
        """The cores an automatic placement weighs this server by: its cores less other jobs' use, at least
        :data:`MIN_FREE` of a core (a busy server still takes a DC when nothing else fits, last)."""
        if self.cpus is None:
            return None
        return max(round(self.cpus - (self.busy or 0.0), 1), MIN_FREE)

    @property
    def target(self) -> str:
        """``user@address`` as ssh takes it (IPv6 addresses need no brackets there)."""
        return f"{self.user}@{self.address}"


@dataclass(frozen=True)
class Cluster:
    servers: tuple[Server, ...]
    mode: str = "emulate"
    launcher: str = ""
    placement: dict[str, str] | None = None  # None: automatic
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    source: str = ""

    def server(self, name: str) -> Server:
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.servers]

    def with_cpus(self, cpus: dict[str, int], busy: dict[str, float] | None = None) -> Cluster:
        """The same cluster with these servers' cores (and other jobs' use of them) filled in, as measured
        (testbed.cluster.capacity)."""
        from dataclasses import replace

        busy = busy or {}
        return replace(self, servers=tuple(replace(s, cpus=cpus.get(s.name, s.cpus), busy=busy.get(s.name, s.busy))
                                           for s in self.servers))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "launcher": self.launcher,
                "placement": "auto" if self.placement is None else dict(self.placement),
                "servers": [{k: v for k, v in s.__dict__.items() if v is not None} for s in self.servers]}


def _expand(path: str | None) -> str | None:
    return None if path is None else str(Path(path).expanduser())


def from_dict(data: Any, source: str = "") -> Cluster:
    """A validated :class:`Cluster` from its mapping (YAML/JSON form)."""
    if not isinstance(data, dict):
        raise ValidationError("cluster", f"expected a mapping, got {type(data).__name__}",
                              "write e.g. {servers: [{name: s1, address: 10.0.0.1}], placement: auto}")
    spec = validate(ClusterSpec, data)
    seen: dict[str, int] = {}
    targets: dict[tuple[str, int], str] = {}
    for i, s in enumerate(spec.servers):
        if s.name in seen:
            raise ValidationError(f"servers[{i}].name", f"duplicate server {s.name!r} (also servers[{seen[s.name]}])",
                                  "give every server a unique name")
        seen[s.name] = i
        key = (s.address, s.port)
        if key in targets:
            raise ValidationError(f"servers[{i}].address", f"{s.address}:{s.port} is also server {targets[key]!r}",
                                  "one entry per server (a server holds several DCs through placement:)")
        targets[key] = s.name
        if s.identity is not None and not Path(s.identity).expanduser().is_file():
            raise ValidationError(f"servers[{i}].identity", f"no key file {s.identity!r}",
                                  "name an existing private key, or leave identity out to use ssh's own")
    launcher = spec.launcher or spec.servers[0].name
    if launcher not in seen:
        raise ValidationError("launcher", f"no server named {launcher!r}", f"use one of: {', '.join(seen)}")
    placement = None
    if isinstance(spec.placement, dict):
        placement = {}
        for dc, server in spec.placement.items():
            if server not in seen:
                raise ValidationError(f"placement.{dc}", f"no server named {server!r}",
                                      f"use one of: {', '.join(seen)}")
            placement[dc] = server
    if spec.known_hosts is not None and not Path(spec.known_hosts).expanduser().parent.is_dir():
        raise ValidationError("known_hosts", f"{spec.known_hosts!r} is in no existing directory",
                              "name a file in an existing directory (ssh adds keys to it)")
    servers = tuple(Server(s.name, s.address, s.user, s.port, _expand(s.identity), s.python, s.checkout, s.gpus,
                           s.max_hosts, s.cpus) for s in spec.servers)
    return Cluster(servers, spec.mode, launcher, placement, _expand(spec.known_hosts), float(spec.connect_timeout),
                   source)


def load(path: str | Path) -> Cluster:
    """A validated :class:`Cluster` from a YAML/JSON file."""
    from topologies.loader import read_mapping

    p = Path(path)
    if not p.is_file():
        raise ValidationError("cluster", f"no cluster file {str(path)!r}",
                              "give the path of a YAML file with servers: and placement: (README \"Several servers\")")
    return from_dict(read_mapping(p), source=str(p))
