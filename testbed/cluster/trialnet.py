"""A trial's network when it spans several servers: what ``run_trial`` asks of a network, over ssh.

``run_trial`` builds an :class:`~testbed.network.emulation.EmulatedNetwork`, starts trainers in its hosts,
samples it, and stops it.  :class:`ClusterTrialNetwork` answers the same calls for a network up on several
servers (emulate mode, :mod:`.launch`), so a trial across servers is the same trial:

* ``start``: every server builds its part (``launch.up``); each remote server gets a scratch directory for
  the trial's records, ``/var/tmp/geo-testbed-trials/<server>/<trial>`` (``launch.SCRATCH``);
* ``popen_trainer``: a host on this machine starts its trainer as on one machine; a host on another server
  gets its job file over ssh (its ``out_dir`` the scratch directory, its ``t0_ns`` shifted by the server's
  measured clock offset, so the ``ts`` it writes are on the launcher's clock) and its trainer through
  ``testbed net exec --until-eof`` there: stdout and stderr come back over ssh into the trial's log file,
  and ending the local ssh (the supervisor's SIGTERM, or the launcher's death) ends the trainer;
* every :data:`POLL_S` seconds each remote scratch directory's record files are copied as they grow into the
  trial directory (:mod:`.stream`, complete lines only); a remote trainer's progress (the supervisor's stall
  watch) is its span file's size there, read by the same poll;
* ``stop``: every remote scratch directory comes back into the trial directory (tar over ssh: events,
  metrics, process records; not the rewritten job files), is removed there, and every part goes down.  A
  server that cannot be reached then leaves what was streamed; ``cluster.records`` in the manifest says so.

Samplers (links, TCP, processes) and the CPU-saturation watch run on every server: the launcher's as on one
machine, every other server's by ``testbed cluster sample`` over ssh (:mod:`.sampling`), their rows merged
into the trial's files at ``stop``.  A link schedule's events go to every server at once (:mod:`.linkset` in
emulate mode, :mod:`.shapeset` in shape mode).  Cross traffic runs between endpoints on the DCs' servers (emulate
mode: temporary nodes on their LANs; shape mode: the servers themselves).

Container hosts (``runtime: docker``, emulate mode): every server that holds them is given the launcher's image
first (:mod:`.images`); the launcher's containers mount the trial directory, every other server's its scratch
directory; a remote trainer runs inside its container by ``net exec --until-eof --container`` (the image's
``python3``, the container's limits, as on one machine), and the manifest's ``runtimes`` holds each
container's image id and Python/torch as read on its own server.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.training.jobs import TORCHRUN_ENV, torchrun_env
from topologies.model import Topology
from traffic_control.errors import ValidationError

from . import launch
from .launch import SCRATCH, as_root
from .model import Cluster
from .placement import place
from .remote import RemoteError
from .stream import RecordStream
from .view import ClusterNetwork, ssh_exec

#: How long ``stop`` waits for the trial's processes on a server to exit before fetching its records (a trainer
#: given SIGTERM by ``net exec --until-eof`` has 3 s before SIGKILL).
EXIT_WAIT_S = 5.0
#: How often a remote trainer's progress (its span file's size) is read.
POLL_S = 2.0
#: Environment a trainer gets on a remote server besides its server's own (the launcher's PATH, HOME and so
#: on mean nothing there).
TRAINER_ENV = ("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES",
               *TORCHRUN_ENV)


def refuse_unsupported(spec: Any, cluster: Cluster) -> None:
    """What a trial across servers does not do, refused before anything is built (exit 2).  (Container hosts in
    shape mode are refused by ``shaping.check_topology``, for ``net up`` as for a trial.)"""
    if spec.schedule and cluster.mode == "shape":  # every event's paths composed on paper (backends: at play)
        from . import shaping
        from .shapeset import paper_states, plan_schedule

        plan_schedule(paper_states(spec.topology, shaping.plan(spec.topology, cluster)), list(spec.schedule))
    if spec.cross_traffic and cluster.mode == "shape":  # a flow starts and ends on a server
        from .shaping import trainer_dcs

        served = trainer_dcs(spec.topology)
        for i, f in enumerate(spec.cross_traffic):
            for key, dc in (("from", f.src), ("to", f.dst)):
                if dc not in served:
                    raise ValidationError(f"cross_traffic[{i}].{key}", f"DC {dc} has no server in shape mode "
                                          "(no hosts: a relay), so no flow can start or end there",
                                          f"use a DC with hosts ({', '.join(served)}), or mode: emulate")


class ClusterTrialNetwork:
    """One trial's network on several servers, with ``EmulatedNetwork``'s trial-facing calls."""

    def __init__(self, topo: Topology, cluster: Cluster, *, impairment: str = "auto",
                 allow_missing_netem: bool = False, seed: int | None = None, trial_dir: Path,
                 log: Callable[[str], None] | None = None) -> None:
        from testbed.network.addressing import plan_network

        self.topo, self.cluster = topo, cluster
        self.impairment_mode, self.allow_missing_netem, self.seed = impairment, allow_missing_netem, seed
        self.trial_dir = trial_dir
        self.log = log or (lambda m: None)
        self.placement = place(topo, cluster) if cluster.mode == "emulate" else None
        self.assignment = self._assignment()
        self.plan = plan_network(topo, with_ps=True)
        self.report: dict[str, Any] = {}
        self.view: ClusterNetwork | None = None
        self.timings: dict[str, float] = {}
        self.impairment: Any = None
        self.applied: dict[str, Any] = {}
        self.gpu_assignment: dict[str, Any] = {}
        self.userspace: list[Any] = []
        self.impairment_failures: list[str] = []
        self.impairment_noticed: list[str] = []
        self.links_down: dict[str, float] = {}
        self.offsets_ns: dict[str, int] = {}
        self.sampler_stats: dict[str, Any] = {}
        #: each remote server's CPU-saturation samples (kept out of sampler_stats, which the manifest holds)
        self.cpu_samples: dict[str, dict[str, Any]] = {}
        #: per schedule event: when it was sent and how long each server took to apply it
        self.schedule_lag: list[dict[str, Any]] = []
        self._t_play = 0.0
        self._agents: dict[str, Any] = {}  # server -> linkset.Agent (a link schedule's)
        tag = f"{trial_dir.parent.name}-{trial_dir.name}"
        self.scratch = {s: f"{SCRATCH}/{s}/{tag}" for s in set(self.assignment.values()) if s != cluster.launcher}
        self.streams = {s: RecordStream(d, trial_dir) for s, d in self.scratch.items()}  # server -> its copies
        self.t0_ns: int | None = None
        self.fetched: dict[str, bool] = {}  # server -> its records came whole (only servers a trial ran on)
        self._halt = threading.Event()
        self._poller: threading.Thread | None = None
        self._local: Any = None
        self._samplers: dict[str, Any] = {}  # server -> (ssh process, the write end of its stdin)
        self._watchdog: Any = None

    def _assignment(self) -> dict[str, str]:
        """DC -> server."""
        assert self.placement is not None
        return self.placement.assignment

    # ---------------------------------------------------------------- life cycle
    def start(self) -> None:
        self.report = launch.up(self.topo, self.cluster, impairment=self.impairment_mode,
                                allow_missing_netem=self.allow_missing_netem, seed=self.seed, log=self.log,
                                shared_dirs=[self.trial_dir])
        self.timings["up_s"] = self.report["up_s"]
        self.offsets_ns = {s: int((r.get("clock") or {}).get("offset_ns", 0)) for s, r in self.report["servers"].items()}
        # each trainer host's GPUs, from its own server's devices (each part or shaper assigned them there)
        self.gpu_assignment = {n: tuple(d) for r in self.report["servers"].values() for n, d in (r.get("gpus") or {}).items()}
        self._attach()
        if self.userspace:  # the launcher's daemons: one that dies fails the trial (as on one machine)
            from testbed.network import impairment as uimp

            self._watchdog = uimp.watch(self)
        for server, d in self.scratch.items():
            srv = self.cluster.server(server)
            self.view.remote(server).run(as_root(srv, ["mkdir", "-p", f"{d}/events", f"{d}/procs", f"{d}/jobs",
                                                       f"{d}/samples"]), timeout=60)
        self._poller = threading.Thread(target=self._poll, name="cluster-progress", daemon=True)
        self._poller.start()

    def _attach(self) -> None:
        """The view of the network just built, and the launcher's own part."""
        assert self.placement is not None
        self.view = ClusterNetwork.from_report(self.topo, self.cluster, self.placement, self.report)
        self.impairment = self.view.impairment
        if self.cluster.launcher in self.report["servers"]:
            self._local = self.view.local()
            self.userspace = self._local.userspace
            self.applied = {self.cluster.launcher: self._local.read_back()}

    def self_test(self, log: Callable[[str], None] | None = None) -> Any:
        """The self-test before training (``testbed.cluster.verify.self_test``)."""
        from .verify import self_test

        return self_test(self.view, log=log)

    def start_samplers(self, t0_ns: int, rate_hz: float, *, links: bool = True, tcp: bool = True,
                       procs: bool = True) -> None:
        """``testbed cluster sample`` on every remote server (over ssh, its own connection; :mod:`.sampling`):
        the collectors the spec asks for, and always the CPU-saturation watch, on the launcher's clock (``t0_ns``
        shifted by the server's offset), into the trial's scratch directory there; it stops when its stdin
        closes (:meth:`stop`, or the launcher's death)."""
        import subprocess

        from .view import ssh_until_eof

        self.t0_ns = t0_ns
        wanted = [f"--{k}" for k, on in (("links", links), ("tcp", tcp), ("procs", procs)) if on]
        for server, d in self.scratch.items():
            argv = ["cluster", "sample", "--out", d, "--server", server, "--t0-ns",
                    str(t0_ns + self.offsets_ns.get(server, 0)), "--rate-hz", str(rate_hz), *wanted]
            pipes: list[int] = []
            p = ssh_until_eof(self.view.remote(server), argv, pipes, owned=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
            self._samplers[server] = (p, pipes[0])
            ready = p.stdout.readline().strip() if p.stdout else ""
            if ready != "ready":
                self.log(f"cluster: {server}: samplers did not start: {tail_of_process(p)}")

    def tcp_targets(self) -> list[Any]:
        """The launcher's TCP-sampler targets: its part's trainer hosts and parameter server."""
        from testbed.collect.tcp_sampler import TcpTarget

        return [TcpTarget(n, self.netns(n)) for n, node in self.plan.nodes.items()
                if node.role in ("host", "ps") and self.is_local(n)]

    def _stop_samplers(self) -> dict[str, Any]:
        """End every remote sampler (EOF on its stdin) and wait for its last record; each one's stats."""
        import os

        out: dict[str, Any] = {}
        for _p, w in self._samplers.values():
            try:
                os.close(w)
            except OSError:
                pass
        for server, (p, _) in self._samplers.items():
            try:
                stdout, stderr = p.communicate(timeout=30)
                last = [ln for ln in stdout.splitlines() if ln.startswith("{")]
                out[server] = json.loads(last[-1]) if last else {"error": launch.tail_of(stderr)}
                sent = out[server].pop("cpu_samples", None)
                if sent is not None:
                    self.cpu_samples[server] = sent
            except Exception as e:
                p.kill()
                out[server] = {"error": f"{type(e).__name__}: {e}"}
        self._samplers.clear()
        self.sampler_stats = out
        return out

    def _merge_samples(self) -> None:
        """Each remote server's samples (fetched as ``samples/<kind>-<server>.jsonl``) appended to the trial's
        one ``samples/<kind>.jsonl``: its rows carry their own link, node or host names, on the launcher's
        clock.  Its ``sampler_stats-<server>.json`` goes too (the manifest's ``remote_sampler_stats`` holds
        it)."""
        samples = self.trial_dir / "samples"
        for kind in ("links", "tcp", "procs"):
            for f in sorted(samples.glob(f"{kind}-*.jsonl")):
                with (samples / f"{kind}.jsonl").open("a", encoding="utf-8") as out:
                    out.write(f.read_text(encoding="utf-8"))
                f.unlink()
        for f in samples.glob("sampler_stats-*.json"):
            f.unlink()

    def remote_cpu_saturation(self, from_s: float | None = None) -> dict[str, Any]:
        """Each remote server's CPU saturation during the trial: its samples judged from ``from_s`` (seconds
        after t0: the start barrier) as the launcher's own are; as that server judged them (every sample)
        when the barrier is unknown or its samples did not come."""
        from testbed.collect.saturation import CpuSaturation

        out = {}
        for server, st in self.sampler_stats.items():
            sent = self.cpu_samples.get(server)
            if sent is not None and from_s is not None:
                out[server] = CpuSaturation.from_samples(sent, 0).record(round(from_s * 1e9))
            elif "cpu_saturation" in st:
                out[server] = st["cpu_saturation"]
        return out

    def stop(self) -> None:
        """Fetch every remote server's records, remove its scratch directory, take every part down."""
        self._halt.set()
        if self._poller is not None:  # no progress read may open a connection while they are being closed
            self._poller.join(timeout=60)
        problems = []
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._samplers:
            self._stop_samplers()
        for agent in self._agents.values():
            agent.close()
        self._agents.clear()
        try:
            for server, d in (self.scratch.items() if self.view is not None else ()):  # up failed: nothing ran
                self.fetched[server] = False
                try:
                    self._fetch(server, d)
                    self.fetched[server] = True
                except Exception as e:  # the other servers' records still come back, every part still goes
                    until = self.streams[server].report(self.t0_ns, False)["streamed_until_s"]
                    problems.append(f"{server}: records not fetched: {e}; what it wrote up to "
                                    f"{until if until is not None else '?'} s after t0 was streamed during the trial")
                    self.log(f"cluster: {problems[-1]}")
            self._merge_samples()
        finally:
            try:
                if self.view is not None:
                    self.view.close()
            finally:  # every part goes down whatever closing the connections did
                out = launch.down(self.cluster, log=self.log)
                problems += [f"{s}: not taken down: {r.get('error')}" for s, r in out.items() if not r.get("ok")]
        if problems:
            raise RuntimeError("; ".join(problems))

    def record(self) -> dict[str, Any]:
        """The manifest's ``cluster``: placement, each server's part and clock, and what was sampled where."""
        return {"mode": self.cluster.mode,
                "placement": self.report.get("placement") or (self.placement.to_dict() if self.placement else {}),
                "servers": self.report.get("servers", {}), "clock_offsets_ns": self.offsets_ns,
                "clock_correction": "each remote trainer's t0_ns is the launcher's plus its server's measured "
                                    "offset, so every ts is on the launcher's clock",
                "scratch": self.scratch,
                **({"images": self.report["images"]} if self.report.get("images") else {}),
                "sampled": "links, TCP connections, trainer processes and CPU saturation on every server (the "
                           "remote ones by `cluster sample` over ssh, their rows merged into samples/*.jsonl, their "
                           "CPU saturation under cpu_saturation.servers)"}

    # ---------------------------------------------------------------- nodes
    def is_local(self, node: str) -> bool:
        assert self.view is not None, "after start()"
        return self.view.is_local(node)

    def netns(self, node: str) -> str:
        from testbed.network import naming

        return naming.netns_name(node)

    def wan_interfaces(self) -> list[dict[str, str]]:
        return self._local.wan_interfaces() if self._local is not None else []

    def docker_config(self, node: str) -> Any:
        """A container host's settings (None: a process host, a router), on whichever server it is."""
        if self.is_local(node):
            return self._local.docker_config(node)
        dc = self.topo.dc(self.plan.nodes[node].dc)
        if self.plan.nodes[node].role not in ("host", "ps") or dc.runtime != "docker":
            return None
        from testbed.network.docker_hosts import HostConfig

        return HostConfig.of(dc)

    def container_pid(self, node: str) -> int | None:
        """A container's first process here (None on another server: nothing here to enter)."""
        return self._local.container_pid(node) if self.is_local(node) else None

    def host_runtimes(self) -> dict[str, Any]:
        """Per container host, on every server: its image (name and the id its container runs) and the image's
        Python and torch, read there (``trial.host_runtimes`` reads the launcher's own)."""
        from testbed.experiments.trial import host_runtimes
        from testbed.network import docker_hosts

        out: dict[str, Any] = host_runtimes(self._local) if self._local is not None else {}
        for node in self.plan.nodes:
            cfg = None if self.is_local(node) else self.docker_config(node)
            if cfg is None:
                continue
            server = self.view.server_of(node)
            srv, name = self.cluster.server(server), docker_hosts.container_name(node)
            r = self.view.remote(server)
            iid = r.run(as_root(srv, ["docker", "inspect", "--format", "{{.Image}}", name]), timeout=60, check=False)
            ver = r.run(as_root(srv, ["docker", "exec", name, "python3", "-c", docker_hosts.VERSION_PROBE]),
                        timeout=120, check=False)
            try:
                versions = json.loads(ver.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                versions = {"error": (ver.stderr or ver.stdout).strip()[-300:]}
            out[node] = {"runtime": "docker", "image": cfg.image, "image_id": iid.stdout.strip() or None,
                         "container": name, "server": server, **versions}
        return out

    def memory_report(self) -> dict[str, dict[str, Any]]:
        return self._local.memory_report() if self._local is not None else {}

    def impairment_health(self) -> list[dict[str, Any]]:
        return self._local.impairment_health() if self._local is not None else []

    def play(self, events: Any, t0_ns: int | None = None) -> Any:
        """Play a link schedule across the servers (:mod:`.linkset`): each event goes to every server at once,
        the launcher's part changed in this process; checked on paper before (``check_schedule``).  Event
        times count from ``t0_ns`` (the trial's t0), not from when the agents are ready."""
        from testbed.network.emulation import check_schedule
        from traffic_control.schedule import SchedulePlayer, origin_of

        from .linkset import Agent

        check_schedule(self.topo, events, self._local.impairment if self._local is not None else None)
        for server in self.scratch:  # every remote server's part-set agent, for the trial's length
            self._agents[server] = Agent(self.view.remote(server))
        self._t_play = origin_of(t0_ns) or time.monotonic()
        return SchedulePlayer(events, self.apply_event).start(self._t_play)

    def apply_event(self, event: Any) -> None:
        """One schedule event on every server; how long each took is kept for the manifest."""
        from .linkset import LinkChange, apply_everywhere

        t = time.monotonic()
        out = apply_everywhere(self.cluster, LinkChange.of_event(event), check_first=False, local=self._local,
                               agents=self._agents, report=False, log=self.log)
        a, b = event.src, event.dst
        self.schedule_lag.append({"t_s": round(t - self._t_play, 3) if self._t_play else None, "link": f"{a}-{b}",
                                  "took_ms": {s: round(v * 1e3, 1) for s, v in out.took_s.items()}})
        self._note_state(event)

    def _note_state(self, event: Any) -> None:
        """A link down/up event kept: the supervisor's hint for a collective's timeout."""
        if event.state is not None:
            key = f"{event.src}<->{event.dst}"
            if event.state == "down":
                self.links_down.setdefault(key, time.monotonic())
            else:
                self.links_down.pop(key, None)

    # ---------------------------------------------------------------- trainers
    def trainer_ifname(self, node: str) -> str:
        """The interface a trainer's collectives bind to (GLOO_SOCKET_IFNAME): a host's own."""
        return "eth0"

    def _popen_local_trainer(self, node: str, argv: list[str], env: dict[str, str], **kw: Any) -> Any:
        return self._local.popen_trainer(node, argv, env=env, **kw)

    def popen_trainer(self, node: str, argv: list[str], *, env: dict[str, str], **kw: Any) -> Any:
        job_path = Path(argv[-1])
        job = json.loads(job_path.read_text())
        env = {**env, **torchrun_env(job)}  # torchrun's launch variables, as on a cluster
        container = self.docker_config(node) is not None
        # its own devices on its server, numbered there (none for a host without gpus:); a container sees
        # only its own (Docker's runtime hands them over)
        if self.gpu_assignment and not container:
            from testbed.network.gpus import visible_devices

            env["CUDA_VISIBLE_DEVICES"] = visible_devices(self.gpu_assignment.get(node))
        if self.is_local(node):
            return self._popen_local_trainer(node, argv, env, **kw)
        server = self.view.server_of(node)
        remote_dir = self.scratch[server]
        # its records go to the scratch directory; its clock zero is the launcher's t0 read on its clock
        job["out_dir"] = remote_dir
        job["t0_ns"] = int(job["t0_ns"]) + self.offsets_ns.get(server, 0)
        job["clock"] = None  # the launcher's clock mapping is not its server's: it reads its own
        remote_job = f"{remote_dir}/jobs/{job_path.name}"
        self.view.remote(server).run(as_root(self.cluster.server(server), ["sh", "-c", f"cat > {shlex.quote(remote_job)}"]),
                                     input=json.dumps(job), timeout=60)
        kv = [f"{k}={env[k]}" for k in env if k in TRAINER_ENV or k.startswith("TESTBED_")]
        py = "python3" if container else self.cluster.server(server).python  # a container's: the image's
        kw.pop("cwd", None)
        cmd = ["env", *kv, py, *argv[1:-1], remote_job]
        # (shape mode's view runs a node's command on its server by the server's name: no container there)
        p = (ssh_exec(self.view.remote(server), node, cmd, self.view._pipes, container=True, **kw) if container
             else self.view.popen(node, cmd, **kw))
        p.trainer_pid = None  # on another server: no local pid to sample
        return p

    def popen(self, node: str, argv: list[str], **kw: Any) -> Any:
        """A command in any node, on its server (cross traffic's generators in their endpoints)."""
        return self.view.popen(node, argv, **kw)

    def add_endpoint(self, dc: str, name: str, host_octet: int, ovs_port: int, as_host: bool = False) -> str:
        return self.view.add_endpoint(dc, name, host_octet, ovs_port, as_host=as_host)

    def remove_endpoint(self, name: str, ovs_port: int) -> None:
        self.view.remove_endpoint(name, ovs_port)

    def clock_offset_ns(self, dc: str) -> int:
        """How far the clock of ``dc``'s server runs off the launcher's (ns)."""
        return self.offsets_ns.get(self.assignment[dc], 0)

    def span_size(self, local_path: Path) -> int:
        """A remote trainer's span file's size as last read there (0 before it exists)."""
        return max((st.size_of(local_path.name) for st in self.streams.values()), default=0)

    def _poll(self) -> None:
        """Every POLL_S: each remote server's new record lines copied here (:mod:`.stream`), which is also how
        a remote trainer's progress is seen."""
        while not self._halt.wait(POLL_S):
            for server, stream in self.streams.items():
                try:
                    stream.poll(self.view.remote(server), lambda argv, s=server: as_root(self.cluster.server(s), argv))
                except RemoteError as e:
                    self.log(f"cluster: records of {server} not streamed: {e}")

    def records_report(self) -> dict[str, Any]:
        """The manifest's ``cluster.records``: per remote server, whether its records came whole at the end or
        only as streamed while the trial ran (and up to when); none where the network was never built."""
        return {s: self.streams[s].report(self.t0_ns, ok) for s, ok in self.fetched.items()}

    def _fetch(self, server: str, remote_dir: str) -> None:
        """The server's scratch directory into the trial directory (jobs excepted), then removed there."""
        t0 = time.monotonic()
        r = self.view.remote(server)
        srv = self.cluster.server(server)
        # a trainer stopped by closing its channel gets SIGTERM there a moment later and writes its last
        # records as it exits: wait for the trial's processes there to be gone (their argv names the directory; the
        # bracket keeps the pattern from matching the shell that runs pgrep)
        deadline = time.monotonic() + EXIT_WAIT_S
        while time.monotonic() < deadline:
            if r.run(as_root(srv, ["pgrep", "-f", f"[{remote_dir[0]}]{remote_dir[1:]}/jobs/"]), timeout=30, check=False).returncode != 0:
                break
            time.sleep(0.2)
        data = r.read(as_root(srv, ["tar", "-C", remote_dir, "--exclude=./jobs", "-cf", "-", "."]), timeout=600)
        extract(data, self.trial_dir)
        r.run(as_root(srv, ["rm", "-rf", remote_dir]), timeout=120)
        self.log(f"cluster: {server}: records fetched ({len(data) / 1e6:.2f} MB) in {time.monotonic() - t0:.1f} s")


@dataclass(frozen=True)
class ShapeNode:
    """A trainer host or the parameter server in shape mode: a process on its DC's server, at its address."""

    name: str
    dc: str
    ip: str
    role: str  # host | ps


@dataclass
class ShapePlan:
    nodes: dict[str, ShapeNode]


class ShapeTrialNetwork(ClusterTrialNetwork):
    """One trial in shape mode (:mod:`.shaper`): every server shapes its egress, trainers run on the servers
    themselves (a DC's hosts share its server's address; their collectives bind to its interface), remote
    ones over ssh with their records fetched back as in emulate mode.

    Samplers: the launcher's shapers' interfaces (one per destination DC) for links; TCP in the server's own
    namespace, narrowed to connections between trainer addresses off the ssh ports (the trainers share that
    namespace with the testbed's control traffic)."""

    def __init__(self, topo: Topology, cluster: Cluster, **kw: Any) -> None:
        from . import shaping

        self.plans = shaping.plan(topo, cluster)
        super().__init__(topo, cluster, **kw)
        where = {p.dc: p for p in self.plans.values()}
        self.plan: Any = ShapePlan({n.name: ShapeNode(n.name, n.dc, where[n.dc].address, n.role)
                                    for n in self.plan.nodes.values() if n.role in ("host", "ps")})

    def _assignment(self) -> dict[str, str]:
        return {p.dc: name for name, p in self.plans.items()}

    def _attach(self) -> None:
        from testbed.network import impairment as uimp

        from .shaper import netns
        from .view import Impairments, ServerNetwork, clocks_of

        servers = self.report["servers"]
        self.view = ServerNetwork(self.topo, self.cluster, self.plans,  # type: ignore[assignment]
                                  hosts={n: self.assignment[node.dc] for n, node in self.plan.nodes.items()},
                                  clocks=clocks_of(self.report))
        self.impairment = Impairments({s: r.get("impairment") for s, r in servers.items()},
                                      tuple(x for r in servers.values() for x in r.get("skipped", [])))
        mine = servers.get(self.cluster.launcher)
        if mine is not None:
            self.userspace = [uimp.attach(netns(), uimp.Point(d["node"], d["ifname"], d["what"]))
                              for d in mine.get("daemons", [])]
            self.applied = {self.cluster.launcher: mine.get("applied")}

    def self_test(self, log: Callable[[str], None] | None = None) -> Any:
        from .verify import shape_self_test

        return shape_self_test(self.view, self.report, log=log)  # type: ignore[arg-type]

    def netns(self, node: str) -> None:
        return None  # the server's own namespace

    def tcp_targets(self) -> list[Any]:
        from .sampling import shape_tcp_target

        mine = self.plans.get(self.cluster.launcher)
        return [shape_tcp_target(self.cluster.launcher, mine.to_dict())] if mine is not None else []

    def trainer_ifname(self, node: str) -> str:
        return self.report["servers"][self.view.server_of(node)]["ifname"]

    def wan_interfaces(self) -> list[dict[str, str]]:
        from .shaper import NODE, netns, ns_ifname

        mine = self.plans.get(self.cluster.launcher)
        return [{"node": NODE, "ifname": ns_ifname(e.dst_dc), "link": f"{mine.dc}->{e.dst_dc}", "netns": netns()}
                for e in (mine.egress if mine else ())]

    def memory_report(self) -> dict[str, dict[str, Any]]:
        return {}

    def impairment_health(self) -> list[dict[str, Any]]:
        from testbed.network import impairment as uimp

        return uimp.health_report(self.userspace)

    def _popen_local_trainer(self, node: str, argv: list[str], env: dict[str, str], **kw: Any) -> Any:
        from testbed.network import docker_hosts
        from testbed.network.emulation import owned_env

        cfg, pid = self.docker_config(node), self.container_pid(node)
        if cfg is not None:  # in its container, which shares the server's network (shape_hosts)
            if pid is None:
                raise RuntimeError(f"{node}: its container ({docker_hosts.container_name(node)}) is not running")
            return docker_hosts.popen_in(pid, cfg, argv, owned_env(node, env), **kw)
        p = self.view.popen(node, argv, env=env, **kw)
        p.trainer_pid = p.pid
        return p

    # ---------------------------------------------------------- cross traffic
    def add_endpoint(self, dc: str, name: str, host_octet: int, ovs_port: int, as_host: bool = False) -> str:
        """Cross traffic's endpoint in ``dc``: the DC's server itself (there is no LAN to add a node to), so
        its flows leave through the same shaper as the trainers' and compete with them on their paths."""
        self.view.hosts[name] = self.assignment[dc]
        return name

    def remove_endpoint(self, name: str, ovs_port: int) -> None:
        self.view.hosts.pop(name, None)

    def endpoint_ip(self, dc: str, host_octet: int) -> str:
        return self.plans[self.assignment[dc]].address

    def play(self, events: Any, t0_ns: int | None = None) -> Any:
        """Play a link schedule (:mod:`.shapeset`): every event planned and checked on paper first, against
        each server's backend, then each sent to every server at once when its time comes (counted from
        ``t0_ns``, the trial's t0)."""
        from traffic_control.schedule import SchedulePlayer, origin_of

        from .linkset import Agent
        from .shapeset import paper_states, plan_schedule

        backends = {n: r.get("impairment") for n, r in self.report["servers"].items()}
        self._changes = plan_schedule(paper_states(self.topo, self.plans, backends), list(events))
        for server in self.plans:  # every remote server's shape-set agent, for the trial's length
            if server != self.cluster.launcher:
                self._agents[server] = Agent(self.view.remote(server), ("cluster", "shape-set", "--serve"))
        self._t_play = origin_of(t0_ns) or time.monotonic()
        return SchedulePlayer(events, self.apply_event).start(self._t_play)

    def apply_event(self, event: Any) -> None:
        from .shapeset import apply_change

        change = self._changes.pop(0)  # the player calls in the schedule's order
        t = time.monotonic()
        _, took = apply_change(self.cluster, change, list(self.plans), self._agents)
        self.schedule_lag.append({"t_s": round(t - self._t_play, 3) if self._t_play else None,
                                  "link": f"{event.src}-{event.dst}",
                                  "took_ms": {s: round(v * 1e3, 1) for s, v in took.items()},
                                  "paths": sorted(f"{self.plans[n].dc}->{d}" for n, m in change.shapes.items()
                                                  for d in m),
                                  "cut": sorted(f"{self.plans[n].dc}->{d}" for n, c in change.cut.items() for d in c)})
        self._note_state(event)

    def docker_config(self, node: str) -> Any:
        """A container host's settings (:mod:`.shape_hosts`; None: a process host), on whichever server."""
        from testbed.network.docker_hosts import HostConfig

        n = self.plan.nodes.get(node)
        dc = self.topo.dc(n.dc) if n is not None else None
        return HostConfig.of(dc) if dc is not None and dc.runtime == "docker" else None

    def container_pid(self, node: str) -> int | None:
        """A container's first process on the launcher (None on another server, or not a container)."""
        from testbed.network import docker_hosts

        if self.docker_config(node) is None or not self.is_local(node):
            return None
        return docker_hosts.running_pid(node)

    def host_runtimes(self) -> dict[str, Any]:
        """Per container host on every server: the image and the id its container runs, the image's Python and
        torch (the other servers' read there over ssh, as in emulate mode)."""
        from testbed.network import docker_hosts

        out = super().host_runtimes()
        for node in self.plan.nodes:
            cfg = self.docker_config(node)
            if cfg is None or not self.is_local(node):
                continue
            out[node] = {"runtime": "docker", "image": cfg.image, "image_id": docker_hosts.running_image_id(node),
                         "container": docker_hosts.container_name(node), "server": self.cluster.launcher,
                         **docker_hosts.versions(node)}
        return out

    def record(self) -> dict[str, Any]:
        out = super().record()
        out["shaping"] = {n: p.to_dict() for n, p in self.plans.items()}
        out["sampled"] = ("every server's shapers (one interface per destination DC) by the link sampler; TCP in "
                          "each server's own namespace, only connections between trainer addresses off its ssh "
                          "ports (node: the server's name); trainer processes and CPU saturation on every server")
        return out


def tail_of_process(p: Any) -> str:
    """What a process that failed to start said (it is ended first)."""
    p.kill()
    try:
        _, err = p.communicate(timeout=10)
    except Exception:
        return "no message"
    return launch.tail_of(err or "")


def extract(archive: bytes, into: Path) -> list[str]:
    """Regular files and directories of a tar archive under ``into``; anything else (links, devices), and any
    name that would land outside ``into``, is refused: the archive comes from another machine."""
    root = into.resolve()
    names = []
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for m in tar.getmembers():
            target = (root / m.name).resolve()
            if target != root and root not in target.parents:
                raise ValueError(f"archive member {m.name!r} lands outside {into}")
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif m.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None
                target.write_bytes(src.read())
                names.append(m.name)
            else:
                raise ValueError(f"archive member {m.name!r} is not a regular file or directory")
    return names
