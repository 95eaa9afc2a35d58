"""The job file: everything one training process needs, as a typed dataclass <-> JSON.

The runner (Mininet or loopback) calls :func:`make_jobs` once per trial,
writes each job with :func:`write_jobs` to ``jobs/<rank>.json`` and starts
``python -m testbed.training.worker jobs/<rank>.json`` (or ``.server``) in
each host.  A process learns its peers only from this file (addresses, not
network objects), so the same code runs in Mininet hosts and on real
machines.

Job file fields (JSON object):

==================  ===========================================================
``role``            ``"worker"`` or ``"server"``
``rank``            workers 0..N-1 in placement order; the server is N
``world_size``      N, the number of *workers* (the server is not in the gloo world)
``host``, ``dc``    this process's host name and data center
``address``         this host's IP on the emulated network (the server binds it)
``ifname``          interface for gloo (``GLOO_SOCKET_IFNAME``); null = let gloo pick
``rendezvous_addr`` torch.distributed TCP store: rank 0's address ...
``rendezvous_port`` ... and port (``training.rendezvous_port``)
``server_addr``     parameter server address/port (null for BSP)
``server_port``
``server_dc``       the server's DC (so spans can say which bytes crossed the WAN)
``peers``           every worker: ``{rank, host, dc, address, group}``
``groups``          Gsyn: worker ranks per group, leader first (null otherwise)
``training``        the validated training section (``TrainingConfig.to_dict()``:
                    workload, scheme, optimizer, stop, eval_every, device,
                    threads, seed, slowdown rules, ports, timeouts)
``slowdown_factor`` this process's resolved compute factor (>= 1)
``slowdown_delays`` this process's resolved random delays (``DelayDist`` dicts)
``compute``         this process's resolved compute model (``training.compute``): ``mode``,
                    the whole ``profile`` entry, ``dc_factor``, ``step_s`` (mean profiled
                    step), ``cv``, ``message_floats`` (padding); see ``training.compute``
``out_dir``         the trial directory (events/, metrics.csv, models/ go there)
``t0_ns``           ``time.time_ns()`` at trial start, the zero of every ``ts``
``clock``           ``{boot_id, offset_ns}``: the wall-from-monotonic mapping every process on the
                    launching machine shares (``collect.recorder.clock_anchor``; null or another
                    boot id: the process reads its own)
``lr``              the learning rate(s) the processes use and why (``testbed.training.lr``:
                    rule, base lr and batch, workers per update, lr per update or per
                    server client); processes apply this record
==================  ===========================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed.collect.recorder import clock_anchor
from testbed.training.compute import resolve as resolve_compute
from testbed.training.config import DelayDist, TrainingConfig, validate_training
from testbed.training.lr import resolve
from testbed.training.schema import ValidationError, from_mapping, to_plain
from traffic_control.files import write_atomic

__all__ = ["Job", "Peer", "Placement", "command_for", "job_name", "make_jobs", "module_for", "write_jobs"]

Role = Literal["worker", "server"]


@dataclass
class Placement:
    """Where one process runs: given by the runner from the network it built."""

    host: str
    dc: str
    address: str
    ifname: str | None = None
    role: Role = "worker"


@dataclass
class Peer:
    rank: int
    host: str
    dc: str
    address: str
    group: int | None = None


def job_name(host: str, role: str, rank: int) -> str:
    """``<host>.<role>.<rank>``: the stem of the process's events/ and logs/ files."""
    return f"{host}.{role}.{rank}"


@dataclass
class Job:
    role: Role
    rank: int
    world_size: int
    host: str
    dc: str
    address: str
    ifname: str | None
    rendezvous_addr: str
    rendezvous_port: int
    server_addr: str | None
    server_port: int | None
    peers: list[Peer]
    groups: list[list[int]] | None
    training: TrainingConfig
    out_dir: str
    t0_ns: int
    slowdown_factor: float = 1.0
    slowdown_delays: list[DelayDist] = field(default_factory=list)
    server_dc: str | None = None  # the parameter server's DC (byte accounting: does a push cross the WAN?)
    compute: dict[str, Any] | None = None  # resolved training.compute for this process (compute.resolve)
    lr: dict[str, Any] | None = None  # testbed.training.lr.LrResolution.to_dict(); None = resolve from training
    clock: dict[str, Any] | None = None  # collect.recorder.clock_anchor() of the launching machine

    @property
    def name(self) -> str:
        return job_name(self.host, self.role, self.rank)

    @property
    def group(self) -> int | None:
        return self.peers[self.rank].group if self.role == "worker" else None

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        out["training"] = self.training.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        d = dict(data)
        d["training"] = validate_training(d.get("training"), field="job.training")
        d["peers"] = [from_mapping(Peer, p, f"job.peers[{i}]") for i, p in enumerate(d.get("peers", []))]
        d["slowdown_delays"] = [from_mapping(DelayDist, p, f"job.slowdown_delays[{i}]")
                                for i, p in enumerate(d.get("slowdown_delays", []))]
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> Job:
        return cls.from_dict(json.loads(text))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Job:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def _placements(placement: Sequence[Any]) -> list[Placement]:
    out = []
    for i, p in enumerate(placement):
        if isinstance(p, Placement):
            out.append(p)
        elif isinstance(p, Mapping):
            out.append(from_mapping(Placement, p, f"placement[{i}]"))
        else:
            host, dc, address, *rest = p
            out.append(Placement(host, dc, address, *rest))
    return out


def make_jobs(
    training_cfg: Mapping[str, Any] | TrainingConfig,
    placement: Sequence[Placement | Mapping[str, Any] | tuple],
    out_dir: str | os.PathLike[str],
    t0_ns: int,
) -> list[Job]:
    """One job per process: workers (ranks in placement order), then the server if the scheme has one.

    ``placement`` lists each process's host, DC, address and interface; at
    most one entry has ``role: server`` (needed by asp/ssp/gsyn, ignored by
    bsp).  Raises ``ValidationError`` for configs that do not fit.
    """
    places = _placements(placement)
    workers = [p for p in places if p.role == "worker"]
    servers = [p for p in places if p.role == "server"]
    tc = validate_training(training_cfg, [(w.host, w.dc) for w in workers])
    if len(servers) > 1:
        raise ValidationError("placement", f"{len(servers)} parameter servers placed", "place at most one")
    server = servers[0] if servers else None
    if tc.uses_server and server is None:
        raise ValidationError("training.scheme.name", f"scheme {tc.scheme.name} needs a parameter server host",
                              "give the topology a ps DC (or use bsp)")
    if not tc.uses_server:
        server = None
    groups: list[list[int]] | None = None
    if tc.scheme.name == "gsyn":
        groups = tc.scheme.params.resolve([(w.host, w.dc) for w in workers], "training.scheme.groups")
    group_of = {r: g for g, members in enumerate(groups or []) for r in members}
    peers = [Peer(r, w.host, w.dc, w.address, group_of.get(r)) for r, w in enumerate(workers)]
    n = len(workers)
    common = {
        "world_size": n,
        "rendezvous_addr": workers[0].address,
        "rendezvous_port": tc.rendezvous_port,
        "server_addr": server.address if server else None,
        "server_port": tc.server_port if server else None,
        "server_dc": server.dc if server else None,
        "peers": peers,
        "groups": groups,
        "training": tc,
        "out_dir": str(out_dir),
        "t0_ns": int(t0_ns),
        "lr": resolve(tc, n, groups).to_dict(),
        "clock": clock_anchor(),
    }
    jobs = []
    for r, w in enumerate(workers):
        factor, delays = 1.0, []
        for rule in tc.slowdown:
            if rule.matches(w.host, w.dc):
                factor *= rule.factor
                if rule.delay is not None:
                    delays.append(rule.delay)
        jobs.append(Job(role="worker", rank=r, host=w.host, dc=w.dc, address=w.address, ifname=w.ifname,
                        slowdown_factor=factor, slowdown_delays=delays,
                        compute=resolve_compute(tc.compute, w.dc), **common))
    if server is not None:
        jobs.append(Job(role="server", rank=n, host=server.host, dc=server.dc, address=server.address,
                        ifname=server.ifname, compute=resolve_compute(tc.compute, None), **common))
    return jobs


#: the launch environment torchrun gives a process (what a trainer started across servers is also told)
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_env(job: Mapping[str, Any]) -> dict[str, str]:
    """torchrun's variables for a worker's job (as JSON): its rank, the world, the rendezvous as master, and
    its place among the workers that share its address (one server's ranks in shape mode).  The testbed's
    own trainers read their job file; these let a user's script started the same way find its peers."""
    if job.get("role") != "worker":
        return {}
    local = sorted(p["rank"] for p in job["peers"] if p["address"] == job["address"])
    return {"RANK": str(job["rank"]), "WORLD_SIZE": str(job["world_size"]),
            "LOCAL_RANK": str(local.index(job["rank"])), "LOCAL_WORLD_SIZE": str(len(local)),
            "MASTER_ADDR": str(job["rendezvous_addr"]), "MASTER_PORT": str(job["rendezvous_port"])}


def write_jobs(jobs: Sequence[Job], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``jobs/<rank>.json`` under ``out_dir``; returns the paths in job order."""
    d = Path(out_dir) / "jobs"
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for job in jobs:
        path = d / f"{job.rank}.json"
        write_atomic(path, job.to_json())
        paths.append(path)
    return paths


def module_for(job: Job) -> str:
    """The ``python -m`` module that runs this job."""
    return "testbed.training.server" if job.role == "server" else "testbed.training.worker"


def process_record_path(out_dir: str | os.PathLike[str], name: str) -> Path:
    """Where process ``name`` writes what it ran on (training.runtime.process_record)."""
    return Path(out_dir) / "procs" / f"{name}.json"


def command_for(job_path: str | os.PathLike[str], job: Job, python: str | None = None) -> list[str]:
    """argv that starts this job (no shell)."""
    import sys

    return [python or sys.executable, "-m", module_for(job), str(job_path)]

