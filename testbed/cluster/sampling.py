"""What another server records during a trial across servers: run there by ``testbed cluster sample`` over ssh.

The launcher samples its own part as on one machine (``testbed.collect``).  Every other server runs one
``cluster sample`` for the trial's length, which samples what only that server can see, with the same
samplers and on the launcher's clock (its ``t0_ns`` is the launcher's plus the server's measured offset):

* **links**: its part's WAN egress and tunnel ends (emulate mode), or its shapers, one per destination DC
  (shape mode) -- ``samples/links-<server>.jsonl``;
* **TCP**: every connection of its trainer hosts' namespaces (emulate mode), or of the server's own namespace
  between the cluster's trainer addresses, its ssh ports left out (shape mode: the trainers share the
  server's namespace with the testbed's own control traffic) -- ``samples/tcp-<server>.jsonl``;
* **processes**: CPU and RSS of the trial's trainers there.  They are started by ssh, so this process does not
  know their pids; it finds them (:class:`TrainerWatch`) by their argv, which ends in a job file of the trial's
  scratch directory, and takes host, role and rank from that job file -- ``samples/procs-<server>.jsonl``;
* **CPU saturation**: the server's cores and its userspace impairment daemons (``testbed.collect.saturation``),
  their samples in the last line it prints (timed from the trial's t0), which the launcher judges from the
  trial's start barrier, as it judges its own, and adds to the trial's ``cpu_saturation`` per server.

It prints ``ready`` once sampling runs, samples until its stdin closes (the launcher ends the trial, or its
connection goes), then prints one JSON line: each sampler's stats and the CPU saturation.  The launcher
fetches the files with the trial's other records and appends each to the trial's own file.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

#: How often the trial's trainers are looked for among this server's processes.
WATCH_S = 0.5


def link_targets() -> list[Any]:
    """This server's shaped interfaces as link-sampler targets: its part's WAN egress and tunnel ends
    (emulate mode), or its shapers, one per destination DC (shape mode)."""
    from ..collect.samplers import LinkTarget
    from . import shaper

    shaped = shaper.read_state()
    if shaped is not None:
        dc = shaped["shaping"]["dc"]
        return [LinkTarget(shaper.NODE, shaper.ns_ifname(e["dst_dc"]), f"{dc}->{e['dst_dc']}", shaper.netns())
                for e in shaped["shaping"]["egress"]]
    from ..network.emulation import EmulatedNetwork

    return [LinkTarget(w["node"], w["ifname"], w["link"], w["netns"]) for w in EmulatedNetwork.attach().wan_interfaces()]


def shape_tcp_target(server: str, shaping: dict[str, Any]) -> Any:
    """Shape mode's one TCP target: the server's own namespace, connections between the cluster's trainer
    addresses only, the testbed's ssh ports and cross traffic's port left out (cross traffic runs on the
    servers themselves in shape mode; its own records say how it fared)."""
    from ..collect.tcp_sampler import TcpTarget
    from ..network.cross_traffic import PORT

    addresses = frozenset([shaping["address"], *(e["address"] for e in shaping["egress"])])
    return TcpTarget(server, None, addresses,
                     frozenset([*(int(p) for p in shaping.get("control_ports", (22,))), PORT]))


def tcp_targets(server: str) -> list[Any]:
    """This server's trainer namespaces (emulate mode: its part's hosts and parameter server), or its own
    namespace narrowed to trainer traffic (shape mode)."""
    from ..collect.tcp_sampler import TcpTarget
    from . import shaper

    shaped = shaper.read_state()
    if shaped is not None:
        return [shape_tcp_target(server, shaped["shaping"])]
    from ..network.emulation import EmulatedNetwork

    net = EmulatedNetwork.attach()
    mine = set(net.part.dcs) if net.part is not None else None
    return [TcpTarget(n.name, net.netns(n.name)) for n in net.plan.nodes.values()
            if n.role in ("host", "ps") and (mine is None or n.dc in mine)]


def daemons() -> dict[str, int]:
    """This server's userspace impairment daemons, ``{node:ifname: pid}`` (the CPU-saturation watch's)."""
    from . import shaper

    shaped = shaper.read_state()
    if shaped is not None:
        return {f"{d['node']}:{d['ifname']}": int(d["pid"]) for d in shaped.get("daemons", [])}
    from ..network.emulation import EmulatedNetwork

    return {f"{imp.node}:{imp.ifname}": imp.pid for imp in EmulatedNetwork.attach().userspace}


def trainer_of(argv: list[str], jobs_dir: str) -> str | None:
    """The job file a trainer's argv names, when it is one of this trial's trainers (``python -m
    testbed.training.<module> <jobs_dir>/<job>.json``), else None.  The ``net exec --until-eof`` wrapper and
    the shell around it name the job file too, but do not run a training module."""
    if len(argv) < 4 or argv[1] != "-m" or not argv[2].startswith("testbed.training."):
        return None
    path = argv[-1]
    return path if os.path.dirname(path) == jobs_dir.rstrip("/") and path.endswith(".json") else None


class TrainerWatch:
    """Finds the trial's trainers among this server's processes and hands each to the process sampler once."""

    def __init__(self, out: str, sampler: Any) -> None:
        self.jobs_dir = str(Path(out) / "jobs")
        self.sampler = sampler
        self.seen: set[int] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainer-watch", daemon=True)

    def start(self) -> TrainerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def scan(self) -> None:
        import psutil

        from ..collect.samplers import ProcTarget

        for proc in psutil.process_iter(["pid", "cmdline"]):
            pid, argv = proc.info["pid"], proc.info["cmdline"] or []
            if pid in self.seen:
                continue
            job_path = trainer_of(argv, self.jobs_dir)
            if job_path is None:
                continue
            self.seen.add(pid)
            try:
                job = json.loads(Path(job_path).read_text())
                self.sampler.add(ProcTarget(pid, job["host"], job["role"], int(job["rank"])))
            except (OSError, ValueError, KeyError) as e:
                self.errors.append(f"pid {pid} ({job_path}): {type(e).__name__}: {e}")

    def _run(self) -> None:
        while True:
            try:
                self.scan()
            except Exception as e:  # never end the watch over one unreadable process table
                self.errors.append(f"{type(e).__name__}: {e}")
            if self._stop.wait(WATCH_S):
                return


def serve(out: str, server: str, t0_ns: int, rate_hz: float, *, links: bool, tcp: bool, procs: bool) -> int:
    """Sample this server for one trial until stdin closes (see the module docstring)."""
    from ..collect.samplers import SamplerSet
    from ..collect.saturation import CpuSaturation

    samplers = SamplerSet(out, t0_ns, links=link_targets() if links else (), rate_hz=rate_hz,
                          tcp=tcp_targets(server) if tcp else (), suffix=f"-{server}").start()
    cpu = CpuSaturation(daemons()).start()
    watch = TrainerWatch(out, samplers.procs).start() if procs else None
    print("ready", flush=True)
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    finally:
        if watch is not None:
            watch.stop()
        stats: dict[str, Any] = samplers.stop()
        stats["cpu_saturation"] = cpu.stop()  # every sample: used only if the launcher cannot judge from the barrier
        stats["cpu_samples"] = cpu.samples(t0_ns)
        if watch is not None:
            stats["trainers_found"] = len(watch.seen)
            if watch.errors:
                stats["trainer_watch_errors"] = watch.errors[:20]
    print(json.dumps(stats, default=str), flush=True)
    return 0
