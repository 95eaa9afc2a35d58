"""Build and tear down the emulated multi-DC network: Mininet hosts, pyroute2 wiring.

Division of labour (after Mininet's "Nodes execute, Intfs configure, Links
connect", done with netlink instead of string-built shell commands):

* **Nodes execute**: every host, parameter server and router is a real Mininet
  :class:`~mininet.node.Host` (own network namespace, a shell for the CLI,
  ``popen`` for processes).  Its namespace is also bound to
  ``/var/run/netns/tb-<node>`` so netlink, samplers and ``ip netns exec`` can
  reach it, and so the network outlives the builder for ``net up`` / ``net down``.
  Every process started in a host joins the host's cgroup (its ``cpu:``
  share) before it execs.
* **Links connect**: veth pairs are created with pyroute2 directly in their
  final namespaces.  Each DC's switch is a Linux bridge in its own namespace
  ``tb-<dc>-sw`` (one port per node, named after the node), never in the root
  namespace: there the host's firewall filters bridged frames (with Docker's
  daemon running, the root FORWARD policy is DROP and bridge netfilter sends
  bridged frames through it: a root-namespace LAN lost 100 % of its traffic).
  WAN links join two routers.
* **Interfaces configure**: addresses, routes and sysctls from the
  :class:`~testbed.network.addressing.NetPlan`; shapes through
  :mod:`traffic_control.netlink`, read back after apply for the manifest.

The network belongs to no process: the userspace impairment daemons run
detached, and ``/run/geo-testbed/net.json`` (:mod:`.state`) records what a
later process needs to :meth:`EmulatedNetwork.attach` to it (``net show``,
``net set``, ``net exec``).  Any failure during ``start`` removes everything
created so far.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, NetNS, netns

from topologies.model import Topology
from traffic_control import netlink as tcnl
from traffic_control.capabilities import probe_kernel
from traffic_control.errors import CapabilityMissing, TrafficControlError, ValidationError
from traffic_control.jitter import interval_s
from traffic_control.jitter_driver import driven
from traffic_control.netlink import NETEM_FIX
from traffic_control.shape import DEFAULT_MTU, WIRE_GSO_SEGS, LinkShape, shape_dict

from . import cgroups, cleanup, docker_hosts, jitter_control, naming, state
from . import impairment as uimp
from .addressing import IfacePlan, NetPlan, NodePlan, WanPlan, plan_network, restrict

IMPAIRMENTS = ("auto", "netem", "userspace", "none")

# TCP buffers large enough for a Gbit/s x 250 ms path (BDP ~ 31 MB).


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
        """A Mininet host whose processes carry the testbed's owner mark and run in its cgroup,
        and whose shell cannot hang the builder by dying while it starts.

        Mininet keeps its own copy of the shell's pty slave open, so when the shell
        dies at start (e.g. ``mnexec -n`` failing: "remount: Invalid argument") the
        read that waits for its first prompt blocks forever.  This host closes that
        copy as soon as the shell runs: a dead shell then reads as an I/O error, which
        becomes a :class:`NodeStartError` naming the node and what it printed.
        """

        #: shells being started, by node name (the builder kills one that takes too long)
        shells: dict[str, Any] = {}

        def startShell(self, mnopts: Any = None) -> None:
            self._starting, self._seen = True, ""
            try:
                super().startShell(mnopts)
            finally:
                self._starting = False

        def _popen(self, cmd: list[str], **params: Any) -> Any:
            env = dict(params.pop("env", None) or os.environ)
            env[naming.OWNER_ENV] = naming.PREFIX
            env["TESTBED_NODE"] = self.name
            enter = cgroups.preexec(self.name)
            if enter is not None and "preexec_fn" not in params:
                params["preexec_fn"] = enter
            p = super()._popen(cmd, env=env, **params)
            if getattr(self, "_starting", False) and params.get("stdin") == getattr(self, "slave", None):
                os.close(self.slave)  # the shell has its own copy now
                self.slave = os.open(os.devnull, os.O_RDWR)  # what Mininet's cleanup will close
                TestbedHost.shells[self.name] = p
            return p

        def read(self, size: int = 1024) -> str:
            try:
                out = super().read(size)
            except OSError:
                if not getattr(self, "_starting", False):
                    raise
                shell = TestbedHost.shells.get(self.name)
                try:
                    code = shell.wait(timeout=2) if shell is not None else None
                except Exception:
                    code = None
                said = self._seen.replace(chr(127), "").strip()[-400:] or "nothing"
                raise NodeStartError(f"node {self.name}: its shell ended while starting (exit status {code}); "
                                     f"it printed: {said}") from None
            if getattr(self, "_starting", False):
                self._seen = (self._seen + out)[-2000:]
            return out

    class DockerHost(TestbedHost):
        """A node that is a Docker container (``runtime: docker``; testbed.network.docker_hosts).

        The container starts first; the node's Mininet shell then runs on the
        host's filesystem inside the container's *network* namespace only
        (``nsenter --net``), so the node's named namespace, netlink handles,
        sysctls, ``tc`` and the measuring tools work exactly as for a process
        host.  Trainers enter the container itself (:meth:`EmulatedNetwork.popen_trainer`).
        """

        def __init__(self, name: str, cfg: Any, shared: list[Path], **params: Any) -> None:
            self.cfg, self.shared = cfg, shared
            self.container_id: str | None = None
            self.container_pid: int | None = None
            super().__init__(name, inNamespace=False, **params)

        def startShell(self, mnopts: Any = None) -> None:
            self.container_id, self.container_pid = docker_hosts.start(self.name, self.cfg, self.shared)
            super().startShell(mnopts)

        def _popen(self, cmd: list[str], **params: Any) -> Any:
            if getattr(self, "_starting", False) and cmd[:1] == ["mnexec"]:
                cmd = ["nsenter", f"--net=/proc/{self.container_pid}/ns/net", *cmd]
            return super()._popen(cmd, **params)

    return Mininet, TestbedHost, DockerHost


#: Seconds the nodes' shells may take to start, per batch of 8 started at once
#: (``TESTBED_NODE_START_TIMEOUT``); a shell still silent then is killed and its node named.
#: Inside the kernel lab (QEMU TCG, every process start ~10-100 x slower; a CI run once saw
#: shells there miss 10 s on a busy host) the default is 60 s.
NODE_START_TIMEOUT_S = float(os.environ.get("TESTBED_NODE_START_TIMEOUT",
                                            "60" if os.environ.get("GEO_TESTBED_IN_LAB") == "1" else "10"))


class NetworkError(RuntimeError):
    """Building the network failed (the message names the node or link, and the cause)."""


class NodeStartError(NetworkError):
    """A node's shell (its namespace) could not start."""


@dataclass
class Impairment:
    """How delay/jitter/loss are realised on this network, and what was skipped."""

    backend: str  # netem | userspace | none
    netem_available: bool | None  # None: not probed (backend none)
    skipped: list[str] = field(default_factory=list)
    seed: int | None = None
    #: netem only: whether its PRNG takes the seed (kernel >= 6.7); None when not known
    netem_seeded: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "netem_available": self.netem_available, "skipped": self.skipped,
                "seed": self.seed, "netem_seeded": self.netem_seeded, "randomness": self.randomness,
                "jitter_model": self.jitter_model}

    @property
    def jitter_model(self) -> str:
        """How jitter with order kept is realised (README "Jitter, defined"); recorded in every manifest."""
        if self.backend == "userspace":
            return ("defined process: one delay draw per interval (default 10 x jitter), order kept; every "
                    "packet sees the defined distribution (traffic_control/jitter.py)")
        if self.backend == "netem":
            return ("defined process: netem's delay set to one draw per interval by the jitter driver "
                    "(traffic_control/jitter_driver.py), order kept by netem's rate")
        return "none (no impairment applied)"

    @property
    def randomness(self) -> str:
        """What decides the loss and jitter draws (recorded, so a reader knows if a trial repeats)."""
        if self.backend == "userspace":
            return f"seeded per daemon from seed {0 if self.seed is None else self.seed} (reproducible)"
        if self.backend == "netem":
            if self.netem_seeded:
                return f"netem PRNG seeded per qdisc from seed {self.seed} (reproducible)"
            return "netem's own unseeded PRNG: this kernel ignores TCA_NETEM_PRNG_SEED (needs Linux >= 6.7), " \
                   "so loss and jitter patterns differ between trials"
        return "none (no impairment applied)"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Impairment:
        return cls(d["backend"], d.get("netem_available"), list(d.get("skipped") or []), d.get("seed"),
                   d.get("netem_seeded"))


def skipped_impairments(topo: Topology) -> list[str]:
    """What a network without an impairment backend leaves out (said out loud and recorded)."""
    out = [f"{lk.a}<->{lk.b}: {lk.forward.describe()} / {lk.reverse.describe()}" for lk in topo.links
           if lk.forward.needs_netem or lk.reverse.needs_netem]
    out += [f"LAN of {dc.name}: {dc.lan.describe()}" for dc in topo.dcs if dc.lan.needs_netem]
    return out


def choose_impairment(topo: Topology, requested: str, allow_missing_netem: bool,
                      netem_available: bool | None = None, seed: int | None = None) -> Impairment:
    """Decide the impairment backend before anything is built (errors leave nothing behind).

    The backend is chosen from what the kernel offers even when the topology
    asks for no delay at start: a link schedule or ``net set`` may add some
    later, and the links must be built so that they can take it in place.
    """
    if requested not in IMPAIRMENTS:
        raise ValidationError("impairment", f"unknown backend {requested!r}", f"use one of: {', '.join(IMPAIRMENTS)}")
    if requested == "none":  # nothing to probe: the kernel's netem is not used either way
        return Impairment("none", netem_available, skipped_impairments(topo), seed)
    if netem_available is None:
        netem_available = probe_kernel()["netem"].ok
    if requested == "netem" or (requested == "auto" and netem_available):
        if not netem_available:
            raise CapabilityMissing("sch_netem", NETEM_FIX)
        return Impairment("netem", True, seed=seed)
    ok, why = _userspace_available()
    if requested == "userspace":
        if not ok:
            raise CapabilityMissing(f"what the userspace impairment backend needs: {why}",
                                    "scripts/bootstrap.sh installs the tools; or use --impairment netem/none")
        return Impairment("userspace", netem_available, seed=seed)
    if ok:
        return Impairment("userspace", netem_available, seed=seed)
    if not topo.needs_netem or allow_missing_netem:
        return Impairment("none", netem_available, skipped_impairments(topo), seed)
    raise CapabilityMissing("sch_netem or the userspace backend", f"{NETEM_FIX}; the userspace backend: {why}")


def check_machine_free(action: str) -> None:
    """Root, and no testbed network up (there is one set of ``tb-*`` names per machine)."""
    if os.geteuid() != 0:
        raise PermissionError(f"{action} needs root: run with sudo")
    existing = cleanup.owned_netns()
    if existing:
        raise NetworkBusy(f"a testbed network is already up ({len(existing)} namespaces, e.g. {existing[0]}); "
                          "run `testbed net down` (or `testbed clean`) first")


def check_preconditions(topo: Topology, impairment: str, allow_missing_netem: bool, *,
                        gpus: bool = True) -> Impairment:
    """Everything :meth:`EmulatedNetwork.start` would refuse before building, checked without building.

    Raises :class:`CapabilityMissing` / :class:`ValidationError` (exit 2 with the fix); returns the
    impairment backend the network would get.
    """
    imp = choose_impairment(topo, impairment, allow_missing_netem)
    if topo.switch == "ovs":
        from . import ovs as ovsctl

        ovsctl.require()
    check_docker_hosts(topo)
    if gpus:  # across servers each server's part checks its own devices as it is built
        check_gpus(topo, plan_network(topo))
    _check_lan_impairment(topo, imp)
    check_backend_features(topo, imp)
    check_transport(topo)
    return imp


def check_backend_features(topo: Topology, imp: Impairment) -> None:
    """Every impairment the spec asks for can be done by the chosen backend (ValidationError naming the
    field and the fix, before anything is built): the userspace daemons hold packet ids, not payloads,
    so they can neither duplicate nor corrupt a packet; under netem a Gilbert-Elliott chain cannot
    share a leaf with order-kept jitter (:func:`refuse_driven_gilbert_elliott`)."""
    where = [(f"links[{i}].{d}", s) for i, lk in enumerate(topo.links)
             for d, s in (("forward", lk.forward), ("reverse", lk.reverse))]
    where += [(f"dcs[{i}].lan", dc.lan) for i, dc in enumerate(topo.dcs)]
    for path, shape in where:
        if imp.backend == "userspace":
            uimp.refuse_payload_features(shape, path)
        elif imp.backend == "netem":
            refuse_driven_gilbert_elliott(shape, path)


def refuse_driven_gilbert_elliott(shape: LinkShape, field: str = "") -> None:
    """netem resets a Gilbert-Elliott chain to its good state on every change that carries the model
    (the kernel's get_loss_clg), and the jitter driver changes an order-kept jittered leaf every
    interval: the bursts would be cut short and the loss rate fall well below the spec's."""
    if shape.gilbert_elliott and driven(shape):
        raise ValidationError(f"{field}.gilbert_elliott" if field else "gilbert_elliott",
                              "under netem, Gilbert-Elliott loss cannot share a link direction with order-kept jitter: "
                              "netem restarts the chain in its good state at every change, and the jitter driver "
                              f"changes the leaf every {interval_s(shape.jitter_s, shape.jitter_interval_s) * 1e3:g} ms",
                              "use reorder: true (netem draws the jitter itself), the userspace backend "
                              "(--impairment userspace: its chain keeps its state), or independent loss")


def check_transport(topo: Topology) -> None:
    """Every DC's TCP congestion control can be set in a network namespace here (ValidationError naming
    ``dcs[i].tcp.congestion_control`` with the fix, before anything is built)."""
    from traffic_control.capabilities import congestion_control_problem

    for i, dc in enumerate(topo.dcs):
        problem = congestion_control_problem(dc.congestion_control)
        if problem:
            msg, _, fix = problem.partition("; fix: ")
            raise ValidationError(f"dcs[{i}].tcp.congestion_control", msg, fix)


def check_gpus(topo: Topology, plan: NetPlan) -> dict[str, tuple[int, ...]]:
    """The GPU devices of every trainer host (``{}`` when no DC asks for GPUs): checked against the machine's
    (ValidationError naming ``dcs[i].gpus``) and, for container hosts, Docker's NVIDIA runtime."""
    from . import gpus

    if not gpus.wanted(topo):
        return {}
    hosts = [(n.name, n.dc) for n in plan.nodes.values() if n.role == "host"]
    out = gpus.assign(topo, hosts, len(gpus.machine_gpus()))
    if any(topo.dc(dc).runtime == "docker" and out.get(node) for node, dc in hosts):
        gpus.check_docker_gpus()
    return out


def check_docker_hosts(topo: Topology) -> None:
    """``runtime: docker`` DCs need a running Docker daemon and their images, checked before anything is built."""
    images = docker_hosts.images_of(topo)
    if not images:
        return
    docker_hosts.require()
    for image, (dc, *_) in images.items():
        if docker_hosts.image_id(image) is None:
            raise docker_hosts.DockerError(
                f"dcs[{dc}].image: image {image!r} is not in the Docker daemon (fix: "
                + ("build it with `testbed image build`" if image == docker_hosts.DEFAULT_IMAGE
                   else "load or build it (docker images lists what there is), or remove image: to use the "
                        "testbed's own") + ")")


def _check_lan_impairment(topo: Topology, imp: Impairment) -> None:
    if imp.backend == "userspace" and any(dc.lan.needs_netem for dc in topo.dcs) \
            and topo.switch != "ovs" and not uimp.bridge_netfilter_loaded():
        raise CapabilityMissing("br_netfilter (the userspace backend holds a LAN's delayed frames in its "
                                "switch, and bridged frames reach a queue only through it)", uimp.BRIDGE_NF_FIX)


def _userspace_available() -> tuple[bool, str]:
    try:
        from traffic_control.userspace import available
    except ImportError as e:
        return False, f"traffic_control.userspace not importable: {e}"
    return available()


class NetworkBusy(RuntimeError):
    """Another testbed network is up on this machine (one at a time: names share the tb- prefix)."""


class NotUp(RuntimeError):
    """No testbed network is up (nothing to attach to)."""


class EmulatedNetwork:
    """One emulated network; use as a context manager or call start()/stop()."""

    def __init__(self, topo: Topology, *, impairment: str = "auto", allow_missing_netem: bool = False,
                 with_ps: bool = True, log: Callable[[str], None] | None = None,
                 netem_available: bool | None = None, seed: int | None = None,
                 shared_dirs: Iterable[str | Path] = (), part: Any = None) -> None:
        self.topo = topo
        self.with_ps = with_ps
        self.seed = seed
        self.plan: NetPlan = plan_network(topo, with_ps=with_ps)
        #: several servers (testbed.cluster.tunnel.Part): this server's DCs and tunnel ends; None: every DC
        self.part = part
        if part is not None:
            self.plan = restrict(self.plan, part.dcs)
        #: several servers: the live one-way delay of WAN directions other servers shape, where a change moved
        #: it from the spec's (this part's queues are sized for the round trips of the flows through them)
        self.remote_delays: dict[tuple[str, str], float] = {}
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
        #: when each failure was noticed (wall clock), for the manifest and the fault tests
        self.impairment_noticed: list[dict[str, Any]] = []
        #: WAN links taken down (schedule or ``set_link_up``) and not back up: "a<->b" -> when (monotonic)
        self.links_down: dict[str, float] = {}
        self._watchdog: Any = None
        self.started = False
        self._building = False  # True once this instance may have created objects (stop() cleans only then)
        self.timings: dict[str, float] = {}
        self._handles: dict[str, Any] = {}
        self.attached = False  # True: built by another process (see attach); stop() leaves it up
        self._sw_handles: dict[str, Any] = {}
        self._bridge_index: dict[str, int] = {}  # switch namespace -> its bridge's ifindex
        #: GPU devices per trainer host (testbed.network.gpus; empty when no DC asks for GPUs)
        self.gpu_assignment: dict[str, tuple[int, ...]] = {}
        #: directories a container host mounts read-write at their own path (a trial's records)
        self.shared_dirs: list[Path] = [Path(d).resolve() for d in shared_dirs]

    # --------------------------------------------------------------- public
    def __enter__(self) -> EmulatedNetwork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EmulatedNetwork:
        check_machine_free("building the network")
        self.impairment = choose_impairment(self.topo, self.requested, self.allow_missing_netem, self._netem_hint,
                                            self.seed)
        if self.topo.switch == "ovs":
            from . import ovs as ovsctl

            ovsctl.require()
        check_docker_hosts(self.topo)
        self.gpu_assignment = check_gpus(self.topo, self.plan)
        _check_lan_impairment(self.topo, self.impairment)
        check_backend_features(self.topo, self.impairment)
        check_transport(self.topo)
        self._check_tunnels()
        if self.impairment.skipped:
            self.log(f"WARNING: impairment backend {self.impairment.backend!r}; delay/jitter/loss are SKIPPED on: "
                     + "; ".join(self.impairment.skipped))
        t0 = time.monotonic()
        self._building = True
        try:
            state.remove_stale()  # a record left by a network that is gone (no tb-* namespace is up)
            self._start_nodes()  # also opens each node's netlink handle (self._handles)
            self._make_switches()
            self.timings["nodes_s"] = time.monotonic() - t0
            self._wire()
            self.timings["wire_s"] = time.monotonic() - t0
            self._shape()
            self._watchdog = uimp.watch(self)
            self.timings["shape_s"] = time.monotonic() - t0
            self._write_state()
            # Inside the guard: closing ~20 handles takes a while (each ends its pyroute2 event loop),
            # and a Ctrl-C landing there left the whole network up (CI, stop 47).
            self._close_handles()
        except BaseException:
            self._close_handles()
            try:
                self.stop()
            except BaseException:  # whatever stopping hit (a second Ctrl-C): the objects still go
                cleanup.cleanup()
                raise
            raise
        self.started = True
        self.timings["up_s"] = time.monotonic() - t0
        return self

    def _close_handles(self) -> None:
        """Close the netlink handles held open during start, each once (also when a Ctrl-C cut this
        short and the failure path calls it again)."""
        for handles in (self._handles, self._sw_handles):
            while handles:
                _, h = handles.popitem()
                try:
                    h.close()
                except Exception:
                    pass

    def _ns(self, node: str) -> Any:
        """Netlink handle into ``node``'s namespace: the one held open during start, else a new one."""
        h = self._handles.get(node)
        return h if h is not None else NetNS(self.netns(node))

    def stop(self) -> None:
        """Tear down what this instance built (cleanup by prefix).

        A no-op when start() never began building (e.g. it refused because
        another testbed network is up): that network must not be torn down;
        and on an attached network (built by another process), which stays
        up until ``testbed net down``.
        """
        self.stop_watching()
        if not self._building:
            return
        # The impairment daemons go with the namespaces (cleanup ends every process in them).
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

    def stop_watching(self) -> None:
        """Stop this process's watchdog and leave the network up (``net up`` returning)."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def host(self, name: str) -> Any:
        return self.nodes[name]

    def docker_config(self, node: str) -> docker_hosts.HostConfig | None:
        """``node``'s container settings (None: a process host; routers always are)."""
        plan = self.plan.nodes[node]
        dc = self.topo.dc(plan.dc)
        if plan.role not in ("host", "ps") or dc.runtime != "docker":
            return None
        return docker_hosts.HostConfig.of(dc, plan.cpu, plan.memory, self.gpu_assignment.get(node, ()))

    def container_pid(self, node: str) -> int | None:
        """The pid of ``node``'s container's first process (None: not a container, or not built here).  On an
        attached network (built by another process: a cluster launcher's own part) Docker is asked."""
        pid = getattr(self.nodes.get(node), "container_pid", None)
        if pid is None and node not in self.nodes and self.attached and self.docker_config(node) is not None:
            pid = docker_hosts.running_pid(node)
        return pid

    def popen_trainer(self, node: str, argv: list[str], *, env: dict[str, str], **kw: Any) -> Any:
        """Start a trainer on ``node``: as :meth:`popen` on a process host (the testbed's Python); in a
        container host, inside the container (its namespaces, so ``python3`` is the image's; its cgroups;
        the spec's ``env``).  ``argv[0]`` is the interpreter: replaced by ``python3`` in a container.
        The Popen's ``trainer_pid`` is the trainer's own pid (in a container, ``nsenter``'s child)."""
        cfg = self.docker_config(node)
        pid = self.container_pid(node)
        if cfg is None or pid is None:
            if self.gpu_assignment:  # its own devices only (none for a host without gpus:)
                from .gpus import visible_devices

                env = {**env, "CUDA_VISIBLE_DEVICES": visible_devices(self.gpu_assignment.get(node))}
            p = self.popen(node, argv, env=env, **kw)
            p.trainer_pid = p.pid
            return p
        # nsenter enters every namespace itself: the Mininet node (absent on an attached network) is not needed
        return docker_hosts.popen_in(pid, cfg, argv, env, **kw)

    def netns(self, node: str) -> str:
        return naming.netns_name(node)

    def add_endpoint(self, dc: str, name: str, host_octet: int, ovs_port: int, as_host: bool = False) -> str:
        """A temporary node on ``dc``'s LAN (:func:`.endpoints.add_endpoint`: cross traffic's, a probe's)."""
        from .endpoints import add_endpoint

        return add_endpoint(self, dc, name, host_octet, ovs_port, as_host=as_host)

    def remove_endpoint(self, name: str, ovs_port: int) -> None:
        from .endpoints import remove_endpoint

        remove_endpoint(name, ovs_port)

    def popen(self, node: str, argv: list[str], **kw: Any) -> Any:
        """Start ``argv`` inside ``node``'s namespace and cgroup (marked for cleanup).

        Through the node's Mininet shell while this process built the network
        (its mount namespace, as Mininet's CLI sees it); otherwise, e.g. on an
        attached network or a temporary probe endpoint, through ``ip netns
        exec`` on the node's named namespace.
        """
        if node in self.nodes:
            return self.nodes[node].popen(argv, **kw)
        return subprocess.Popen(exec_argv(node, argv), env=owned_env(node, kw.pop("env", None)),
                                preexec_fn=kw.pop("preexec_fn", None) or cgroups.preexec(node), **kw)

    # ------------------------------------------------------------ attaching
    @classmethod
    def attach(cls, log: Callable[[str], None] | None = None) -> EmulatedNetwork:
        """The network that is up on this machine (built by any process), for changing and inspecting it.

        Raises :class:`NotUp` when none is.  ``stop()`` on the result is a
        no-op: the network stays until ``testbed net down``.
        """
        from topologies import from_dict

        rec = state.read()
        if rec is None or not cleanup.owned_netns():
            raise NotUp("no testbed network is up (start one with `testbed net up TOPOLOGY`)")
        topo = from_dict(rec["topology"])
        part = None
        if rec.get("part"):
            from testbed.cluster.tunnel import Part

            part = Part.from_dict(rec["part"])
        net = cls(topo, impairment=rec["impairment"]["backend"], with_ps=rec.get("with_ps", True), log=log,
                  seed=rec.get("seed"), part=part)
        net.impairment = Impairment.from_dict(rec["impairment"])
        for w in [*net.plan.wans, *net.plan.tunnels]:  # a tunnel: the direction this server shapes
            for attr, key in (("forward", f"{w.a}->{w.b}"), ("reverse", f"{w.b}->{w.a}")):
                if key in rec.get("links", {}):
                    object.__setattr__(w, attr, LinkShape(**rec["links"][key]))
        net.remote_delays = {(a, b): float(d) for a, b, d in rec.get("remote_delays", [])}
        net.gpu_assignment = {n: tuple(d) for n, d in (rec.get("gpus") or {}).items()}
        net._resize_lans(net._live_queue_rtts(), apply=False)  # what an earlier `net set` left in the kernel
        for d in rec.get("userspace", []):
            point = uimp.Point(d["node"], d["ifname"], d["what"])
            try:
                net.userspace.append(uimp.attach(naming.netns_name(point.node), point))
            except Exception as e:
                net.impairment_failures.append(f"{point.node}:{point.ifname}: no daemon state ({e})")
        net.attached = True
        net.started = True
        return net

    def impairment_health(self) -> list[dict[str, Any]]:
        """Every userspace daemon of this network (alive, or dead and failing closed); last, under the netem
        backend with jitter, the jitter driver (dead: the delays stop varying, frozen at one interval's)."""
        out = uimp.health_report(self.userspace)
        if self.impairment is not None and self.impairment.backend == "netem":
            leaves = jitter_control.leaves_of(self)
            if leaves:
                h = jitter_control.health() or {}
                pid = jitter_control.running_pid()
                out.append({"node": "(root)", "ifname": "-", "realises": f"netem jitter driver, {len(leaves)} leaves",
                            "alive": pid is not None, "state": h.get("state", "missing"),
                            "reason": "" if pid is not None else "not running: the jittered links' delay no longer "
                            f"varies (last error: {h.get('last_error')})", "pid": pid,
                            "stats": {k: h.get(k) for k in ("changes", "errors", "late_mean_ms", "late_max_ms")},
                            "fail_closed": False})
        return out

    def memory_report(self) -> dict[str, dict[str, Any]]:
        """Per memory-limited node: its limit, the most it used, and how many processes the OOM killer ended."""
        return {n: {"limit": p.memory, "peak": cgroups.memory_peak(n), "oom_kills": cgroups.oom_kills(n)}
                for n, p in self.plan.nodes.items() if p.memory is not None}

    def cli(self) -> None:
        from mininet.cli import CLI

        CLI(self.mn)

    def wan_interfaces(self) -> list[dict[str, str]]:
        """Every shaped WAN egress: node, namespace, interface, and the DC link direction it carries."""
        return [{"node": node, "netns": self.netns(node), "ifname": ifn, "link": f"{src}->{dst}"}
                for src, dst, node, ifn, _ in self.wan_directions()]

    def change_link(self, a: str, b: str, shape: LinkShape) -> None:
        """Change the a->b direction of a live WAN link in place (``tc change``; any backend).

        netem: the leaf was built as netem, so delay, jitter and loss come and
        go with ``change``.  userspace: the rate changes in HTB, the rest in
        the link's daemon, which is started here if the link had no
        impairment before.  none: a change that needs delay/jitter/loss is an
        error (nothing can apply it), never silently ignored.
        """
        for w, src, dst, node, ifn, attr in self._shaped():
            if (src, dst) == (a, b):
                old = getattr(w, attr)
                netem = self.impairment is not None and self.impairment.backend == "netem"
                # a leaf leaving the jitter driver is released first (sync waits for the driver to
                # read it), else one of its stale interval changes could land after ours
                release = netem and driven(old) and not driven(shape)
                if release:
                    object.__setattr__(w, attr, shape)
                    jitter_control.sync(self)
                try:
                    self._change(node, ifn, f"{a}->{b}", old, shape)
                except BaseException:
                    if release:
                        object.__setattr__(w, attr, old)
                        jitter_control.sync(self)
                    raise
                object.__setattr__(w, attr, shape)
                resized = self._resize_queues() if shape.delay_s != old.delay_s else []
                self._save_links()
                if netem and (driven(shape) or any(driven(s) for s in resized)):
                    jitter_control.sync(self)
                return
        raise self._no_link(a, b, "->")

    def _shaped(self) -> list[tuple[WanPlan, str, str, str, str, str]]:
        """(link, src DC, dst DC, router, interface, the link's attribute holding the shape) of every WAN
        direction this machine shapes: both of each link, and of a tunnelled link (several servers) the one
        leaving this server's DC."""
        out = []
        for w in self.plan.wans:
            out += [(w, w.a, w.b, w.a_router, w.a_if, "forward"), (w, w.b, w.a, w.b_router, w.b_if, "reverse")]
        for w in self.plan.tunnels:
            out.append((w, w.a, w.b, w.a_router, w.a_if, "forward") if w.a_router in self.plan.nodes
                       else (w, w.b, w.a, w.b_router, w.b_if, "reverse"))
        return out

    def holds(self, a: str, b: str) -> bool:
        """Whether this machine shapes the a->b direction (on several servers: the server of a's router)."""
        return any((src, dst) == (a, b) for _, src, dst, *_ in self._shaped())

    def note_remote_delay(self, a: str, b: str, delay_s: float) -> None:
        """Another server changed the delay of a->b, which it shapes: this part's queues follow the round
        trips of the flows through them (a no-op where none crosses a->b)."""
        if self.holds(a, b):
            raise ValueError(f"{a}->{b} is shaped on this server: change it with change_link")
        self.remote_delays[(a, b)] = delay_s
        resized = self._resize_queues()
        self._save_links()
        if resized and self.impairment is not None and self.impairment.backend == "netem" \
                and any(driven(x) for x in resized):
            jitter_control.sync(self)

    def _live_queue_rtts(self) -> dict[tuple[str, str], float]:
        """``Topology.queue_rtts`` with the live WAN delays (a change may have moved them, here or on another
        server)."""
        delays = dict(self.remote_delays)
        for w, src, dst, _, _, attr in self._shaped():
            delays[(src, dst)] = getattr(w, attr).delay_s
        return self.topo.queue_rtts(delays)

    def _resize_queues(self) -> list[LinkShape]:
        """After a delay changed: give every other WAN direction and every LAN queue with a derived limit
        the queue a network built with the live delays would have (its flows' round trips changed; the
        routes did not).  Returns the shapes that were changed (WAN and LAN impairments).
        """
        rtts = self._live_queue_rtts()
        changed = self._resize_lans(rtts, apply=True)
        for w, src, dst, node, ifn, attr in self._shaped():
            cur = getattr(w, attr)
            new = cur.with_changes(queue_rtt_s=rtts.get((src, dst)))
            if cur.limit is None and new.netem_limit != cur.netem_limit:
                self._change(node, ifn, f"{src}->{dst}", cur, new)
                object.__setattr__(w, attr, new)
                changed.append(new)
                self.log(f"{src}->{dst}: queue {cur.netem_limit} -> {new.netem_limit} packets "
                          f"(its flows' longest round trip is now {new.queue_rtt_s * 1e3:.1f} ms)")
        return changed

    def _resize_lans(self, rtts: dict[tuple[str, str], float], *, apply: bool) -> list[LinkShape]:
        """Each DC's LAN queues (node egress, switch ports, the switch's userspace daemon) sized for the
        longest round trip from that DC (``rtts[(dc, dc)]``), as ``plan_network`` sizes them.

        ``apply=False`` only brings the plan in line (a process attaching to a network whose delays an
        earlier ``net set`` changed: the kernel already holds these sizes).  Returns the LAN impairment
        shapes that changed (node egress and switch daemons).
        """
        backend = self.impairment.backend if self.impairment is not None else "none"
        changed: list[LinkShape] = []

        def requeued(shape: LinkShape | None, rtt: float) -> LinkShape | None:
            if shape is None or shape.limit is not None:
                return shape
            new = shape.with_changes(queue_rtt_s=rtt)
            return shape if new.netem_limit == shape.netem_limit else new

        for node in self.plan.nodes.values():
            rtt = rtts[(node.dc, node.dc)]
            for i, ifc in enumerate(node.ifaces):
                if ifc.peer_node:
                    continue
                egress, port = requeued(ifc.egress, rtt), requeued(ifc.port_egress, rtt)
                if egress is ifc.egress and port is ifc.port_egress:
                    continue
                if apply and egress is not ifc.egress and ifc.egress is not None \
                        and (backend == "netem" or ifc.egress.rate_bps):
                    leaf_netem = backend == "netem" and ifc.egress.needs_netem
                    tcnl.change(ifc.name, ifc.egress, egress, netns=self.netns(node.name), netem=leaf_netem,
                                handle=self._handles.get(node.name),
                                seed=self._qdisc_seed(node.name, ifc.name) if leaf_netem else None)
                if apply and port is not ifc.port_egress and ifc.port_egress is not None:
                    tcnl.change(ifc.port, ifc.port_egress, port, netns=ifc.switch_netns, netem=False,
                                handle=self._sw_handles.get(ifc.switch_netns or ""))
                node.ifaces[i] = replace(ifc, egress=egress, port_egress=port)
                if egress is not ifc.egress and egress is not None and egress.needs_netem:
                    changed.append(egress)  # a jittered LAN leaf: the caller syncs the jitter driver
                if apply and node.role == "router" and ifc.egress is not None and egress is not None:
                    self.log(f"LAN of {node.dc}: queues {ifc.egress.netem_limit} -> {egress.netem_limit} packets "
                             f"(its flows' longest round trip is now {rtt * 1e3:.1f} ms)")
        for k, sw in enumerate(self.plan.switches):
            imp_shape = requeued(sw.lan_impairment, rtts[(sw.dc, sw.dc)])
            if imp_shape is sw.lan_impairment or imp_shape is None:
                continue
            if apply and backend == "userspace":
                for imp in self.userspace:
                    if imp.point.what == f"lan:{sw.dc}":
                        uimp.change(imp, imp_shape)
            self.plan.switches[k] = replace(sw, lan_impairment=imp_shape)
            changed.append(imp_shape)
        return changed

    def _no_link(self, a: str, b: str, sep: str) -> ValidationError:
        """The error for a link this network does not hold: none in the topology, or one that crosses to
        another server (several servers: only its local end is here)."""
        if any({w.a, w.b} == {a, b} for w in self.plan.tunnels):
            return ValidationError("link", f"link {a}-{b} crosses servers (a VXLAN tunnel): the {a}->{b} "
                                   "direction is shaped on the server of DC " + a,
                                   "change it from the launcher: testbed net set A B ... --cluster FILE")
        if self.part is not None and any({lk.a, lk.b} == {a, b} for lk in self.topo.links):
            return ValidationError("link", f"link {a}-{b} is on another server",
                                   "change it from the launcher: testbed net set A B ... --cluster FILE")
        return ValidationError("link", f"no WAN link {a}{sep}{b}", f"name two adjacent DCs ({self._link_names()})")

    def _link_names(self) -> str:
        return ", ".join(f"{w.a}-{w.b}" for w in self.plan.wans)

    def shape_of(self, a: str, b: str) -> LinkShape:
        for w, src, dst, _, _, attr in self._shaped():
            if (src, dst) == (a, b):
                return getattr(w, attr)
        raise self._no_link(a, b, "->")

    def spec_changes(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Shape changes written in spec units, as the kernel gets them: rates times the topology's scale."""
        out = dict(changes)
        if out.get("rate_bps") and self.topo.scale != 1.0:
            out["rate_bps"] = out["rate_bps"] * self.topo.scale
        return out

    def changed_shape(self, a: str, b: str, changes: dict[str, Any]) -> LinkShape:
        """The shape a->b would get from ``changes`` (spec units, as ``net set`` and schedules write them),
        refused (ValidationError naming the field) when invalid or when this network's backend cannot apply
        it; nothing is touched."""
        new = self.shape_of(a, b).with_changes(**self.spec_changes(changes))
        if self.impairment is not None and self.impairment.backend == "userspace":
            from .impairment import refuse_payload_features

            refuse_payload_features(new)  # the daemons hold ids, not payloads
        if self.impairment is not None and self.impairment.backend == "netem":
            refuse_driven_gilbert_elliott(new, f"net set {a}->{b}")
        return new

    def apply_event(self, event: Any) -> None:
        """Apply one :class:`traffic_control.schedule.LinkEvent` (shape change and/or down/up).

        Rates in a schedule are spec rates, like the topology's: they are
        multiplied by the topology's ``scale``.
        """
        if event.changes:
            for a, b in event.directions():
                self.change_link(a, b, self.shape_of(a, b).with_changes(**self.spec_changes(event.changes)))
        if event.state is not None:
            self.set_link_up(event.src, event.dst, event.state == "up")

    def play(self, events: list[Any], t0_ns: int | None = None) -> Any:
        """Play a link schedule against this running network (background thread); event times count from
        ``t0_ns`` (a trial's t0, the zero of its records) or from now."""
        from traffic_control.schedule import SchedulePlayer, origin_of

        check_schedule(self.topo, events, self.impairment)
        return SchedulePlayer(events, self.apply_event).start(origin_of(t0_ns))

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        """Link down/up event: both router interfaces of link a-b."""
        for w in [*self.plan.wans, *self.plan.tunnels]:
            if {w.a, w.b} == {a, b}:
                # a tunnelled link: this server's end (the other server downs its own)
                ends = [(r, i) for r, i in ((w.a_router, w.a_if), (w.b_router, w.b_if)) if r in self.plan.nodes]
                for router, ifname in ends:
                    tcnl.set_link_state(ifname, up, netns=self.netns(router))
                if up:  # routes through a downed interface are flushed by the kernel
                    for n, _ in ends:
                        self._configure_routes(self.plan.nodes[n])
                    self.links_down.pop(f"{w.a}<->{w.b}", None)
                else:
                    self.links_down.setdefault(f"{w.a}<->{w.b}", time.monotonic())
                return
        raise self._no_link(a, b, "-")

    def link_report(self) -> dict[str, Any]:
        """Every WAN direction as the kernel reports it now: tc state, interface state, daemon."""
        daemons = {(imp.point.node, imp.ifname): h for imp, h in zip(self.userspace, self.impairment_health())}
        out: dict[str, Any] = {}
        for src, dst, node, ifn, shape in self.wan_directions():
            ns = self.netns(node)
            entry: dict[str, Any] = {"node": node, "ifname": ifn, "spec": shape.to_dict(),
                                     "tc": tcnl.show(ifn, netns=ns), "link": tcnl.link_state(ifn, netns=ns)}
            if (node, ifn) in daemons:
                entry["userspace"] = daemons[(node, ifn)]
            out[f"{src}->{dst}"] = entry
        return out

    def wan_directions(self) -> list[tuple[str, str, str, str, LinkShape]]:
        """(src DC, dst DC, router, interface, shape) of every WAN direction this machine shapes: both of each
        link, and on a server's part (testbed.cluster) the one leaving its own DC of each tunnelled link."""
        return [(src, dst, router, ifn, getattr(w, attr)) for w, src, dst, router, ifn, attr in self._shaped()]

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
                    where = ifc.switch_netns or "root"
                    out[f"{where}:{ifc.port}"] = tcnl.show(ifc.port, netns=ifc.switch_netns,
                                                           handle=self._sw_handles.get(ifc.switch_netns or ""))
        return out

    # -------------------------------------------------------------- building
    def _start_nodes(self) -> None:
        """Start every node's Mininet shell, bind its namespace, set its sysctls, open its netlink handle.

        Starting a shell is mostly waiting for bash to print its prompt, and
        opening a namespace's netlink socket is a fork (pyroute2 creates it in
        a child that enters the namespace), so the shells start from a small
        thread pool while this thread opens the handles of those already up.
        The handles are opened here, not in the pool: a pyroute2 socket is
        bound to the asyncio loop of the thread that made it, and used from
        another thread it sets up its transport again on every call
        (measured: 8x8 build 4.2 s -> 6.0 s).  Nodes are registered with
        Mininet afterwards, in plan order (Mininet's own addHost is not
        thread-safe).
        """
        Mininet, TestbedHost, DockerHost = _mininet()
        self.mn = Mininet(topo=None, build=False, controller=None, autoSetMacs=False, waitConnected=False)
        plans = list(self.plan.nodes.values())

        def start_one(node: NodePlan) -> Any:
            cfg = self.docker_config(node.name)
            if cfg is not None:  # the container's own --cpus/--memory limit it
                h = DockerHost(node.name, cfg, self.shared_dirs, ip=None)
            else:
                h = TestbedHost(node.name, ip=None)
            netns.attach(node.netns, h.pid)
            if cfg is None and (node.cpu is not None or node.memory is not None):
                cgroups.limit(node.name, h.pid, node.cpu, node.memory)
            # one shell round trip per node for the sysctls netlink cannot reach
            # IPv6 off: the testbed speaks IPv4 only, and IPv6's own chatter (router solicitations,
            # MLD, DAD) would cross the shaped links, count in their bytes and consume the impairment's
            # random draws at times that differ from trial to trial.
            # The congestion control is set explicitly (a new namespace inherits the machine's default,
            # BBR on the development machines, whose PROBE_RTT pauses a flow for 200 ms every 10 s).
            cc = self.topo.dc(node.dc).congestion_control
            cmds = node_sysctls(self.topo, node)
            got = h.cmd("sysctl -qw " + " ".join(cmds) + " 2>&1; cat /proc/sys/net/ipv4/tcp_congestion_control")
            if got.strip().splitlines()[-1:] != [cc]:
                raise NetworkError(f"{node.name}: could not set TCP congestion control {cc!r}: {got.strip()[-300:]}")
            return h

        workers = 8
        deadline = time.monotonic() + NODE_START_TIMEOUT_S * max(1, -(-len(plans) // workers))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(start_one, n) for n in plans]
            errors = []
            for node, fut in zip(plans, futures):
                try:
                    h = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                except FuturesTimeout:
                    # a shell that is alive but silent: kill it, so that its thread ends too
                    shell = TestbedHost.shells.get(node.name)
                    if shell is not None and shell.poll() is None:
                        shell.kill()
                    errors.append(f"node {node.name}: its shell did not start within {NODE_START_TIMEOUT_S:g} s "
                                  "(TESTBED_NODE_START_TIMEOUT)")
                    continue
                except NodeStartError as e:
                    errors.append(str(e))
                    continue
                except Exception as e:  # keep going: every started shell must be registered for cleanup
                    errors.append(f"node {node.name}: {type(e).__name__}: {e}")
                    continue
                self.mn.hosts.append(h)
                self.mn.nameToNode[node.name] = h
                self.nodes[node.name] = h
                try:
                    self._handles[node.name] = NetNS(node.netns)
                except Exception as e:
                    errors.append(f"node {node.name}: cannot open its namespace {node.netns}: {e}")
        for node in plans:
            TestbedHost.shells.pop(node.name, None)
        if errors:
            raise NodeStartError("starting the nodes failed: " + "; ".join(errors)
                                 + " (fix: `testbed doctor` checks namespaces and Mininet's mnexec)")

    def _make_switches(self) -> None:
        """One namespace per DC switch with its Linux bridge (OVS bridges live in the root namespace)."""
        for sw in self.plan.switches:
            if sw.netns is None:
                continue
            netns.create(sw.netns)
            h = NetNS(sw.netns)
            self._sw_handles[sw.netns] = h
            h.link("set", index=h.link_lookup(ifname="lo")[0], state="up")
            holds = self.impairment is not None and self.impairment.backend == "userspace" and \
                sw.lan_impairment is not None
            switch_sysctls(sw.netns, bridged_to_iptables=holds)
            h.link("add", ifname=sw.bridge, kind="bridge")
            self._bridge_index[sw.netns] = h.link_lookup(ifname=sw.bridge)[0]
            h.link("set", index=self._bridge_index[sw.netns], state="up")

    def _wire(self) -> None:
        from mininet.link import Intf

        def no_move(*_a: Any, **_k: Any) -> bool:
            return True

        if self.topo.switch == "ovs":
            self._wire_ovs()
        # LAN: the switch side of each veth in the switch's namespace, the node side in the node's
        for node in self.plan.nodes.values():
            pid = self.nodes[node.name].pid
            for ifc in node.ifaces:
                if ifc.port is None or ifc.switch_netns is None:
                    continue
                sw = self._sw_handles[ifc.switch_netns]
                # enslaved and up in the same request that creates it (IFLA_MASTER, IFF_UP)
                sw.link("add", ifname=ifc.port, kind="veth", peer={"ifname": ifc.name, "net_ns_pid": pid},
                        master=self._bridge_index[ifc.switch_netns], state="up")
                if ifc.mtu != DEFAULT_MTU:  # the bridge follows its ports' smallest MTU
                    sw.link("set", index=sw.link_lookup(ifname=ifc.port)[0], mtu=ifc.mtu)
        # WAN: created in router a's namespace with the peer in router b's
        for w in self.plan.wans:
            self._handles[w.a_router].link("add", ifname=w.a_if, kind="veth",
                                           peer={"ifname": w.b_if, "net_ns_pid": self.nodes[w.b_router].pid})
        # WAN links to DCs on other servers: this end of each link's tunnel, as the veth end it replaces
        for w, router, ifname, mtu in self._tunnel_ends():
            from testbed.cluster import tunnel

            tunnel.create(self.part.tunnels[tunnel.link_key(w.a, w.b)], ifname, mtu, self.nodes[router].pid)
        for node in self.plan.nodes.values():
            ns = self._handles[node.name]
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            for ifc in node.ifaces:
                idx = ns.link_lookup(ifname=ifc.name)[0]
                ns.addr("add", index=idx, address=ifc.address, prefixlen=ifc.prefixlen)
                if ifc.mtu != DEFAULT_MTU:  # the spec's mtu is the interface's, not only HTB's burst sizing
                    ns.link("set", index=idx, mtu=ifc.mtu)
                if not self.topo.gso:  # wire-sized packets: a queue limit in packets means what it says
                    ns.link("set", index=idx, gso_max_segs=WIRE_GSO_SEGS)
                ns.link("set", index=idx, state="up")
            self._configure_routes(node)
            h = self.nodes[node.name]
            for port, ifc in enumerate(node.ifaces):
                intf = Intf(ifc.name, node=h, port=port, moveIntfFn=no_move)
                intf.ip, intf.prefixLen = ifc.address, ifc.prefixlen

    def _wire_ovs(self) -> None:
        """``switch: ovs``: bridges and their ports in the root namespace (OVS's datapath lives there)."""
        from . import ovs as ovsctl

        with IPRoute() as root:
            for sw in self.plan.switches:
                ovsctl.add_bridge(sw.bridge)
                root.link("set", index=root.link_lookup(ifname=sw.bridge)[0], state="up")
            for node in self.plan.nodes.values():
                pid = self.nodes[node.name].pid
                for ifc in node.ifaces:
                    if ifc.port is None or ifc.switch_netns is not None:
                        continue
                    root.link("add", ifname=ifc.port, kind="veth", peer={"ifname": ifc.name, "net_ns_pid": pid},
                              **({"mtu": ifc.mtu} if ifc.mtu != DEFAULT_MTU else {}))
                    ovsctl.add_port(ifc.bridge, ifc.port)
                    root.link("set", index=root.link_lookup(ifname=ifc.port)[0], state="up")

    def _tunnel_ends(self) -> list[tuple[WanPlan, str, str, int]]:
        """(link, local router, its interface, MTU) of every WAN link that crosses to another server."""
        out = []
        for w in self.plan.tunnels:
            router, ifname = (w.a_router, w.a_if) if w.a_router in self.plan.nodes else (w.b_router, w.b_if)
            out.append((w, router, ifname, w.forward.mtu))
        return out

    def _check_tunnels(self) -> None:
        """Every tunnel end named by the part, and its MTU fits the servers' network (before building)."""
        if not self.plan.tunnels:
            return
        from testbed.cluster import tunnel

        for w, _, _, mtu in self._tunnel_ends():
            key = tunnel.link_key(w.a, w.b)
            if key not in self.part.tunnels:
                raise ValueError(f"link {key} crosses servers but the part names no tunnel for it")
            i = next(k for k, lk in enumerate(self.topo.links) if {lk.a, lk.b} == {w.a, w.b})
            tunnel.check_fits(self.part.tunnels[key], mtu, f"links[{i}].mtu")

    def _configure_routes(self, node: NodePlan) -> None:
        held = node.name in self._handles
        ns = self._ns(node.name)
        try:
            for r in node.routes:
                ns.route("replace", dst="0.0.0.0/0" if r.dst == "default" else r.dst, gateway=r.via)
        finally:
            if not held:
                ns.close()

    # --------------------------------------------------------------- shaping
    def _wan_direction(self, node: str, ifname: str) -> str:
        for w in [*self.plan.wans, *self.plan.tunnels]:
            if (w.a_router, w.a_if) == (node, ifname):
                return f"{w.a}->{w.b}"
            if (w.b_router, w.b_if) == (node, ifname):
                return f"{w.b}->{w.a}"
        raise KeyError((node, ifname))

    def _qdisc_seed(self, node: str, ifname: str) -> int | None:
        """netem's PRNG seed for one qdisc (None without a network seed: netem's default behaviour)."""
        if self.seed is None:
            return None
        return uimp.seed_for(self.seed, f"{node}.{ifname}")

    def _shape(self) -> None:
        """Shape every interface; start the userspace daemons (in parallel: each waits for its rules)."""
        assert self.impairment is not None
        backend = self.impairment.backend
        use_netem = backend == "netem"
        points: list[tuple[uimp.Point, LinkShape]] = []
        for node in self.plan.nodes.values():
            h = self._handles[node.name]
            for ifc in node.ifaces:
                if ifc.peer_node:
                    # WAN: always a tree, so that any change later is a `tc change`; the leaf is
                    # netem under the netem backend (also while the link has no delay).
                    tcnl.apply(ifc.name, ifc.egress, netns=node.netns, netem=use_netem, handle=h,
                               seed=self._qdisc_seed(node.name, ifc.name) if use_netem else None)
                    if backend == "userspace" and ifc.egress.needs_netem:
                        what = self._wan_direction(node.name, ifc.name)
                        points.append((uimp.Point(node.name, ifc.name, what), ifc.egress))
                    continue
                self._shape_lan(node, ifc, h, backend)
        if backend == "userspace":  # a LAN's delay/jitter/loss: held in its switch, once per bridged frame
            for sw in self.plan.switches:
                if sw.lan_impairment is not None and sw.netns is not None:
                    points.append((uimp.Point(naming.switch_name(sw.dc), sw.bridge, f"lan:{sw.dc}"),
                                   sw.lan_impairment))
        if points:
            with ThreadPoolExecutor(max_workers=min(8, len(points))) as pool:
                futures = [pool.submit(uimp.start, naming.netns_name(p.node), p, shape, self.seed)
                           for p, shape in points]
                errors = []
                for (p, _), fut in zip(points, futures):
                    try:
                        self.userspace.append(fut.result())
                    except Exception as e:  # every started daemon must be known (cleanup), then fail
                        errors.append(f"{p.node}:{p.ifname}: {e}")
            if errors:
                raise RuntimeError("starting the userspace impairment failed: " + "; ".join(errors))
        if use_netem:  # jitter with order kept: the defined per-interval process, moved by the driver
            jitter_control.sync(self)
        self.applied = self.read_back()
        if use_netem and self.seed is not None:
            seeds = [v["shape"].get("prng_seed") for k, v in self.applied.items() if v["shape"].get("leaf") == "netem"]
            self.impairment.netem_seeded = bool(seeds) and all(x is not None for x in seeds)

    def _shape_lan(self, node: NodePlan, ifc: IfacePlan, h: Any, backend: str) -> None:
        """LAN: node egress carries rate (and, under netem, delay/jitter/loss); the switch port the rate."""
        if ifc.egress is not None:
            if backend == "netem":
                tcnl.apply(ifc.name, ifc.egress, netns=node.netns, netem=ifc.egress.needs_netem, handle=h,
                           seed=self._qdisc_seed(node.name, ifc.name) if ifc.egress.needs_netem else None)
            elif ifc.egress.rate_bps:  # rate only: its delay/loss is the ingress daemon's (userspace) or skipped
                tcnl.apply(ifc.name, ifc.egress, netns=node.netns, netem=False, handle=h)
        if ifc.port and ifc.port_egress is not None:
            tcnl.apply(ifc.port, ifc.port_egress, netns=ifc.switch_netns, netem=False,
                       handle=self._sw_handles.get(ifc.switch_netns or ""))

    def _change(self, node: str, ifname: str, what: str, old: LinkShape, new: LinkShape) -> None:
        assert self.impairment is not None
        backend = self.impairment.backend
        if backend == "netem":
            refuse_driven_gilbert_elliott(new, what)
        if backend == "none" and new.needs_netem:
            raise TrafficControlError(f"{what}: cannot apply {new.describe()}: this network was built without an "
                                      "impairment backend (--impairment none) (fix: bring it up with "
                                      "--impairment auto, netem or userspace)")
        use_netem = backend == "netem"
        tcnl.change(ifname, old, new, netns=self.netns(node), netem=use_netem,
                    seed=self._qdisc_seed(node, ifname) if use_netem else None)
        if backend != "userspace":
            return
        for imp in self.userspace:
            if imp.point.node == node and imp.ifname == ifname:
                uimp.change(imp, new)
                return
        if new.needs_netem:  # the link's first delay/jitter/loss: its daemon starts now
            imp = uimp.start(self.netns(node), uimp.Point(node, ifname, what), new, self.seed)
            self.userspace.append(imp)
            if self._watchdog is not None:
                self._watchdog.add(imp)
            self._save_userspace()

    # ----------------------------------------------------------------- state
    def _write_state(self) -> None:
        rec = {"topology": self.topo.to_dict(), "with_ps": self.with_ps, "seed": self.seed,
               "impairment": self.impairment.to_dict() if self.impairment else None,
               "nodes": {n: {"netns": p.netns, "role": p.role, "dc": p.dc, "ip": p.ip, "cpu": p.cpu,
                             "memory": p.memory}
                         for n, p in self.plan.nodes.items()},
               "switches": {sw.dc: {"netns": sw.netns, "bridge": sw.bridge} for sw in self.plan.switches},
               "links": self._links_record(), "userspace": self._userspace_record(),
               "part": self.part.to_dict() if self.part is not None else None,
               "gpus": {n: list(d) for n, d in self.gpu_assignment.items()},
               "created": time.time(), "builder_pid": os.getpid()}
        state.write(rec)

    def _links_record(self) -> dict[str, Any]:
        return {f"{src}->{dst}": shape_dict(getattr(w, attr)) for w, src, dst, _, _, attr in self._shaped()}

    def _userspace_record(self) -> list[dict[str, Any]]:
        return [{"node": imp.point.node, "ifname": imp.ifname, "what": imp.point.what, "state_dir": str(imp.point.state_dir)} for imp in self.userspace]

    def _save_links(self) -> None:
        links = self._links_record()
        remote = [[a, b, d] for (a, b), d in sorted(self.remote_delays.items())]

        def save(rec: dict[str, Any]) -> None:
            rec["links"] = links
            rec["remote_delays"] = remote

        state.update(save)

    def _save_userspace(self) -> None:
        record = self._userspace_record()
        state.update(lambda rec: rec.__setitem__("userspace", record))


def read_state() -> dict[str, Any] | None:
    """The record of the network that is up (see :mod:`.state`), or None."""
    return state.read()


def check_schedule(topo: Topology, events: list[Any], imp: Impairment | None = None) -> None:
    """Play ``events`` on paper against ``topo``, before anything is built: every link exists, every shape
    the schedule leads to is valid (e.g. no jitter above the delay then in force), and the backend can apply
    it.  Rates are scaled as :meth:`EmulatedNetwork.apply_event` scales them."""
    shapes = {}
    for lk in topo.links:
        shapes[(lk.a, lk.b)], shapes[(lk.b, lk.a)] = lk.forward, lk.reverse
    links = ", ".join(f"{x}-{y}" for x, y in sorted((lk.a, lk.b) for lk in topo.links))
    for i, ev in enumerate(events):
        where = f"schedule[{i}] (t={ev.time_s:g}s)"
        changes = dict(ev.changes)
        if changes.get("rate_bps") and topo.scale != 1.0:
            changes["rate_bps"] *= topo.scale
        for a, b in ev.directions():
            if (a, b) not in shapes:
                raise ValidationError(f"{where}.link", f"no WAN link {a}->{b} in topology {topo.name!r}",
                                      f"use one of: {links}")
            try:
                shapes[(a, b)] = shapes[(a, b)].with_changes(**changes)
            except ValidationError as e:
                raise e.under(f"{where}.{a}->{b}") from None
            if imp is not None and imp.backend == "none" and shapes[(a, b)].needs_netem:
                raise ValidationError(where, f"{a}->{b} would get {shapes[(a, b)].describe()} but the network "
                                      "has no impairment backend (--impairment none)",
                                      "use --impairment auto, netem or userspace")


def exec_argv(node: str, argv: list[str]) -> list[str]:
    """Run ``argv`` in ``node``'s named namespace (``ip netns exec``: also its own /sys view)."""
    return ["ip", "netns", "exec", naming.netns_name(node), *argv]


def owned_env(node: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the testbed starts in ``node`` (marked for cleanup)."""
    out = dict(os.environ if env is None else env)
    out[naming.OWNER_ENV] = naming.PREFIX
    out["TESTBED_NODE"] = node
    return out


def tcp_mem(maximum: int) -> str:
    """``tcp_rmem``/``tcp_wmem`` (min, initial, max) with the spec's ceiling; the initial never above it."""
    from topologies.model import MIN_TCP_BUFFER, TCP_BUFFER_DEFAULT

    return f"{MIN_TCP_BUFFER} {min(TCP_BUFFER_DEFAULT, maximum)} {maximum}"


def node_sysctls(topo: Topology, node: NodePlan) -> list[str]:
    """``key=value`` sysctls of one node's namespace (quoted for a shell): TCP buffers and congestion control,
    no reverse-path filter, no IPv6, forwarding on routers (see ``_start_nodes``)."""
    dc = topo.dc(node.dc)
    cmds = [f"net.ipv4.tcp_rmem='{tcp_mem(dc.receive_buffer)}'", f"net.ipv4.tcp_wmem='{tcp_mem(dc.send_buffer)}'",
            "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.tcp_slow_start_after_idle=0",
            f"net.ipv4.tcp_congestion_control={topo.dc(node.dc).congestion_control}",
            "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    if node.role == "router":
        cmds.append("net.ipv4.ip_forward=1")
    return cmds


def switch_sysctls(ns_name: str, bridged_to_iptables: bool = False) -> None:
    """A switch namespace: IPv6 off (a bridge needs no addresses); bridged frames to iptables or not.

    ``bridge-nf-call-*`` are per namespace (Linux >= 5.3), so this leaves the
    root namespace's values alone.  Off by default: nothing in the switch's
    namespace filters frames (its tables are empty), and skipping netfilter
    saves each frame the trip.  On (IPv4) where the userspace backend holds a
    LAN's frames in this switch.  The bridge keys exist only where
    br_netfilter is loaded.
    """
    keys = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    values = {"bridge-nf-call-iptables": int(bridged_to_iptables), "bridge-nf-call-ip6tables": 0,
              "bridge-nf-call-arptables": 0}
    keys += [f"net.bridge.{k}={v}" for k, v in values.items() if os.path.exists(f"/proc/sys/net/bridge/{k}")]
    subprocess.run(["ip", "netns", "exec", ns_name, "sysctl", "-qw", *keys],
                   check=False, capture_output=True, timeout=10)
