"""One trial: a fresh network, the training processes in its hosts, collectors, records.

Order of events (each step's failure still runs every later cleanup step):

1. build the network (:class:`EmulatedNetwork`), read back the tc state;
2. write the job files, start the samplers, start the parameter server then
   the workers inside their Mininet hosts (``popen``: own namespace, traffic
   on the emulated interface, ``GLOO_SOCKET_IFNAME=eth0``);
3. supervise: a process that exits non-zero marks the trial failed and the
   others are stopped within a second; a trial past its timeout is stopped;
   Ctrl-C stops cleanly;
4. stop samplers, write ``manifest.json`` (spec, tc state, seeds, exit status
   of every process, start/end), tear the network down, merge ``trace.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traffic_control.files import write_atomic, write_json_atomic

from ..collect.saturation import CpuSaturation
from ..network.emulation import EmulatedNetwork
from ..network.selftest import quick_check
from ..provenance import provenance
from ..training.supervise import ProcSpec, Supervisor
from .spec import ExperimentSpec, SchemeRun


@dataclass
class ProcInfo:
    name: str
    host: str
    role: str
    rank: int
    popen: Any
    log: Path
    returncode: int | None = None
    started: float = field(default_factory=time.time)


@dataclass
class TrialResult:
    label: str
    rep: int
    dir: Path
    status: str  # ok | failed | interrupted | timeout
    reason: str = ""
    wall_s: float = 0.0
    last: dict[str, Any] = field(default_factory=dict)


def _tail_step(events: Path | None) -> int | None:
    """Steps rank 0 has started, from the last spans of its event file (for the live display)."""
    if events is None:
        return None
    try:
        with events.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines[1:] if len(lines) > 1 else lines):  # the first may be cut
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        step = rec.get("step")  # compute spans only: an eval span's step counts steps done, not started
        if rec.get("phase") == "compute" and isinstance(step, int):
            return step + 1
    return None


def _tail_metrics(trial_dir: Path) -> dict[str, Any]:
    """Last row of metrics.csv (for the live progress line)."""
    p = trial_dir / "metrics.csv"
    try:
        with p.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().decode(errors="replace").splitlines()
        header = p.open().readline().strip().split(",")
        if len(lines) < 2:
            return {}
        vals = lines[-1].split(",")
        if len(vals) != len(header) or vals == header:
            return {}
        return dict(zip(header, vals))
    except OSError:
        return {}


def run_trial(spec: ExperimentSpec, scheme: SchemeRun, rep: int, trial_dir: Path,
              progress: Callable[..., None] | None = None, log: Callable[[str], None] | None = None,
              stop_flag: Callable[[], bool] | None = None, name: str | None = None) -> TrialResult:
    """One trial on a fresh network; ``name`` is how its messages name it (default ``trial LABEL rREP``;
    the lr search names its trials by scheme and lr, which is what its progress line shows)."""
    from ..collect.recorder import anchored_offset, events_path
    from ..collect.samplers import LinkTarget, ProcTarget, SamplerSet
    from ..collect.tcp_sampler import TcpTarget
    from ..collect.trace import merge_trial
    from ..training.jobs import Placement, command_for, make_jobs, write_jobs

    say = log or (lambda m: None)
    name = name or f"trial {scheme.label} r{rep}"
    show = progress or (lambda *a, **kw: None)
    stopped = stop_flag or (lambda: False)
    trial_dir.mkdir(parents=True, exist_ok=False)
    (trial_dir / "logs").mkdir()
    training = dict(scheme.training)
    training["seed"] = spec.seed + rep
    training = _prepare_training(spec, training, trial_dir)
    manifest: dict[str, Any] = {
        "experiment": spec.name, "label": scheme.label, "scheme": scheme.label, "rep": rep,
        "spec_hash": spec.spec_hash, "spec": spec.raw, "training": training, "seed": training["seed"],
        "topology": spec.topology.to_dict(), "provenance": provenance(), "argv": sys.argv,
        "start": time.time(), **({"sweep": spec.sweep_point} if spec.sweep_point else {}),
    }
    manifest["compute"] = compute_record(training)  # real or emulated accelerator: reports say which ran
    target = (training.get("stop") or {}).get("target")
    if isinstance(target, dict) and target.get("metric") in ("loss", "acc"):
        manifest["target"] = {target["metric"]: target.get("value")}  # the report's time-to-target
    result = TrialResult(scheme.label, rep, trial_dir, "failed")
    # The trial's seed also seeds the impairment's random draws (loss, jitter), so a repetition repeats.
    if spec.cluster is not None:  # the same trial, its network and trainers spread over servers
        from ..cluster.trialnet import ClusterTrialNetwork, ShapeTrialNetwork

        kind = ShapeTrialNetwork if spec.cluster.mode == "shape" else ClusterTrialNetwork
        net: Any = kind(spec.topology, spec.cluster, impairment=spec.impairment,
                        allow_missing_netem=spec.allow_missing_netem, seed=training["seed"], trial_dir=trial_dir,
                        log=say)
    else:
        net = EmulatedNetwork(spec.topology, impairment=spec.impairment,
                              allow_missing_netem=spec.allow_missing_netem, log=say, seed=training["seed"],
                              shared_dirs=[trial_dir])
    procs: list[ProcInfo] = []
    samplers = None
    player = None
    cross = None
    cpu = None
    t_start = time.monotonic()
    try:
        net.start()
        manifest["network"] = {"up_s": net.timings.get("up_s"), "impairment": net.impairment.to_dict()
                               if net.impairment else None}
        manifest["tc_state"] = net.applied
        if net.gpu_assignment:  # each trainer host's devices (each process records the one it used)
            manifest["gpus"] = {node: list(d) for node, d in net.gpu_assignment.items()}
        # across servers, the network reads each container on its own server
        runtimes = net.host_runtimes() if hasattr(net, "host_runtimes") else host_runtimes(net)
        if runtimes:  # container hosts: the image each ran, and the Python and torch inside it
            manifest["runtimes"] = runtimes
        # the network as the spec says? (min RTT and rate per WAN direction; the trial runs either way,
        # and its manifest, the summary and the figures say when it was not)
        if spec.cluster is not None:
            manifest["cluster"] = net.record()
            manifest["selftest"] = net.self_test(log=say).to_dict()
        else:
            manifest["selftest"] = quick_check(net, log=say).to_dict()
        cpu = CpuSaturation({f"{imp.node}:{imp.ifname}": imp.pid for imp in net.userspace}).start()
        t0 = time.time_ns()
        manifest["t0_ns"] = t0
        # the interface collectives bind to: eth0 in an emulated host; in shape mode the server's own
        ifname = net.trainer_ifname if spec.cluster is not None else (lambda node: "eth0")
        placement = [Placement(n.name, n.dc, n.ip, ifname(n.name), "worker") for n in net.plan.nodes.values()
                     if n.role == "host"]
        placement += [Placement(n.name, n.dc, n.ip, ifname(n.name), "server") for n in net.plan.nodes.values()
                      if n.role == "ps"]
        # container hosts see the trial directory at its absolute path only (their cwd is the project's tree)
        jobs = make_jobs(training, placement, trial_dir.resolve() if runtimes else trial_dir, t0)
        manifest["lr"] = jobs[0].lr  # what the processes applied (testbed.training.lr), and where it came from
        manifest["lr_provenance"] = scheme.lr_provenance or {"source": "given"}
        paths = write_jobs(jobs, trial_dir)
        if spec.collectors.links or spec.collectors.procs or spec.collectors.tcp:
            links = [LinkTarget(w["node"], w["ifname"], w["link"], w["netns"]) for w in net.wan_interfaces()] \
                if spec.collectors.links else []
            tcp = ([TcpTarget(n.name, net.netns(n.name)) for n in net.plan.nodes.values() if n.role in ("host", "ps")]
                   if spec.cluster is None else net.tcp_targets()) if spec.collectors.tcp else []
            samplers = SamplerSet(trial_dir, t0, links=links, rate_hz=spec.collectors.rate_hz, tcp=tcp,
                                  offset_ns=anchored_offset(jobs[0].clock)).start()  # the trainers' clock
        if spec.cluster is not None:  # every other server's samplers and CPU watch, over ssh
            c = spec.collectors
            net.start_samplers(t0, c.rate_hz, links=c.links, tcp=c.tcp, procs=c.procs)
        # server first, so workers find it listening
        order = sorted(zip(jobs, paths), key=lambda jp: 0 if jp[0].role == "server" else 1)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0")
        specs = [ProcSpec(job.name, job.role, primary=job.role == "worker", payload=(job, path)) for job, path in order]

        def start(ps: ProcSpec) -> Any:
            job, path = ps.payload
            logf = trial_dir / "logs" / f"{job.name}.log"
            with logf.open("wb") as fh:
                p = net.popen_trainer(job.host, command_for(path.resolve() if runtimes else path, job), stdout=fh, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, cwd=str(Path.cwd()))
            procs.append(ProcInfo(job.name, job.host, job.role, job.rank, p, logf))
            if samplers is not None and spec.collectors.procs and p.trainer_pid is not None:
                samplers.add_process(ProcTarget(p.trainer_pid, job.host, job.role, job.rank))
            return p

        if spec.cross_traffic:  # background flows on the WAN, from t0 (each flow's start after it)
            from ..network.cross_traffic import CrossTraffic

            cross = CrossTraffic(net, spec.cross_traffic, trial_dir, t0_ns=t0, seed=training["seed"], log=say).start()
        player = net.play(spec.schedule, t0_ns=t0) if spec.schedule else None  # its times count from t0
        spans = {job.name: events_path(trial_dir, job.host, job.role, job.rank) for job, _ in order}
        pids = {}

        def progress(name: str) -> Any:
            """A marker that changes with progress: the span file's size, and CPU time until the first span."""
            try:
                size = spans[name].stat().st_size
            except OSError:  # not here yet; or on another server, where its size is read over ssh
                size = net.span_size(spans[name]) if spec.cluster is not None else 0
            if size:
                return size
            pid = pids.get(name)
            return ("starting", _cpu_ticks(pid) if pid else None)

        def start_and_note(ps: ProcSpec) -> Any:
            p = start(ps)
            pids[ps.name] = p.trainer_pid
            return p

        sup = Supervisor(specs, start_and_note, timeout_s=spec.timeout_s, stall_s=spec.stall_s, progress=progress,
                         grace_s=float(os.environ.get("TESTBED_STOP_GRACE_S", "3")),
                         drain_s=float(os.environ.get("TESTBED_PS_DRAIN_S", "15")))

        def faults() -> list[str]:
            """Reasons the network stopped being what the spec says (each fails the trial)."""
            out = list(net.impairment_failures)
            if player is not None:
                out += [f"link schedule: {e}" for e in player.errors]
            return out

        rank0 = next((spans[j.name] for j, _ in order if j.role == "worker" and j.rank == 0), None)
        monitor = _Monitor(sup, trial_dir, scheme.label, rep, show, stopped, faults, rank0)
        monitor.start()
        try:
            res = sup.run()
        finally:
            monitor.stop()
        memory = net.memory_report()
        if memory:
            manifest["memory"] = memory
        result = _result(res, monitor, scheme.label, rep, trial_dir, procs, memory)
        if spec.cluster is not None and result.status != "ok":  # ssh's own status for a lost connection
            # only where a remote process's exit is the reason given (ssh stopped by the teardown says 255 too)
            lost = sorted({net.view.server_of(p.host) for p in procs if p.returncode == 255 and not net.is_local(p.host)
                           and f"{p.name} exited with status 255" in result.reason})
            if lost:
                result.reason += f" | status 255 is ssh's: the connection to {', '.join(lost)} was lost"
        if result.status != "ok" and net.links_down:  # the likely cause of a collective's timeout: say so
            now = time.monotonic()
            result.reason += " | WAN link down at the time: " + ", ".join(
                f"{k} (down for {now - t:.1f} s, by the link schedule)" for k, t in sorted(net.links_down.items()))
        late = faults()
        if result.status == "ok" and late:  # e.g. a schedule event that failed as the trial ended
            result = TrialResult(scheme.label, rep, trial_dir, "failed", "network fault: " + "; ".join(late))
    except KeyboardInterrupt:
        result = TrialResult(scheme.label, rep, trial_dir, "interrupted", "Ctrl-C")
    except Exception as e:
        import traceback

        try:  # the reason is one line; where it came from goes beside the processes' logs
            (trial_dir / "logs" / "trial-error.log").write_text(traceback.format_exc())
        except OSError:
            pass
        result = TrialResult(scheme.label, rep, trial_dir, "failed", f"{type(e).__name__}: {e}")
    finally:
        with interrupts_deferred(say):  # a second Ctrl-C must not leave the network up
            _finish(manifest, result, procs, player, net, samplers, cpu, trial_dir, t_start, spec, say,
                    merge_trial, cross, name=name)
    result.last = _tail_metrics(trial_dir)
    return result


def remote_cpu_saturation(manifest: dict[str, Any], servers: dict[str, dict[str, Any]]) -> None:
    """Other servers' CPU saturation into the trial's ``cpu_saturation``: under ``servers``, and each saturated
    reason, named by its server, among the trial's (a starved server's links and trainers are as unfaithful
    as the launcher's)."""
    if not servers:
        return
    sat = manifest.setdefault("cpu_saturation", {"saturated": []})
    sat["servers"] = servers
    sat["saturated"] = list(sat.get("saturated") or []) + [f"{s}: {r}" for s, st in servers.items()
                                                            for r in st.get("saturated") or []]


def faithfulness(manifest: dict[str, Any]) -> list[str]:
    """Why a trial's network or machine was not what its figures assume (empty: faithful).

    The self-test before training (``testbed.network.selftest``), cross traffic that failed
    (a flow the spec asked for did not run), and the CPU saturation during it
    (``testbed.collect.saturation``); a trial without a
    self-test record (it never got that far) is not called unfaithful for it.
    """
    out = []
    st = manifest.get("selftest")
    if isinstance(st, dict):
        out += [f"self-test: {p}" for p in st.get("problems") or []]
    ct = manifest.get("cross_traffic")
    if isinstance(ct, dict):  # background flows the spec asked for that did not run
        out += [f"cross traffic: {e}" for e in ([ct["error"]] if ct.get("error") else ct.get("errors") or [])]
    sat = manifest.get("cpu_saturation")
    if isinstance(sat, dict):
        out += [f"CPU saturated: {r}" for r in sat.get("saturated") or []]
    return out


@contextmanager
def interrupts_deferred(say: Callable[[str], None]) -> Iterator[None]:
    """Run the block to its end even if Ctrl-C comes.

    The trial's teardown (stop processes, remove the network, write the manifest) must not be
    cut half-way: a second Ctrl-C landing in it left the network up and the trial without its
    manifest (seen once in CI).  A press keeps its meaning where it has one (the runner's
    handler sets its stop flag, so the run ends after this teardown); one that would raise
    KeyboardInterrupt (the runner's second press, Python's default) is only noted: the trial is
    already stopping, and the run stops right after it.  Main thread only (signal handlers can
    be set nowhere else); elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGINT)
    pending: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        try:
            if callable(old):
                old(signum, frame)
            elif old == signal.SIG_DFL:
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            if not pending:
                say("Ctrl-C: tearing the trial down first (processes, network, manifest), then stopping")
            pending.append(signum)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if pending and old in (signal.default_int_handler, signal.SIG_DFL):
        raise KeyboardInterrupt  # no runner to stop after the trial: the caller gets the Ctrl-C now


def _finish(manifest: dict[str, Any], result: TrialResult, procs: list[ProcInfo], player: Any, net: Any,
            samplers: Any, cpu: CpuSaturation | None, trial_dir: Path, t_start: float, spec: ExperimentSpec,
            say: Callable[[str], None], merge_trial: Callable[..., Any], cross: Any = None,
            name: str = "trial") -> None:
    """The trial's teardown and records: processes, cross traffic, schedule, daemons' health, samplers,
    network, manifest, trace (every step guarded: a failing one never skips the later ones)."""
    _stop_all(procs)
    if cross is not None:
        try:
            manifest["cross_traffic"] = cross.stop()
        except Exception as e:  # never lose the manifest over the background flows
            manifest["cross_traffic"] = {"error": f"{type(e).__name__}: {e}"}
    if cpu is not None:  # judged below, from the start barrier, once the records say when it was
        cpu.halt()
    if player is not None:
        player.stop()
        manifest["schedule"] = {"applied": [[round(t, 3), ev.src, ev.dst, ev.changes, ev.state]
                                            for t, ev in player.applied], "errors": player.errors}
        if getattr(net, "schedule_lag", None):  # several servers: how long each took to apply each event
            manifest["schedule"]["servers"] = net.schedule_lag
    if net.impairment_noticed:
        manifest["impairment_failures"] = net.impairment_noticed
    if net.userspace:
        try:
            manifest["impairment_health"] = net.impairment_health()
        except Exception as e:
            manifest["impairment_health"] = {"error": str(e)}
    if net.impairment is not None:  # after apply: netem_seeded is known then
        manifest.setdefault("network", {})["impairment"] = net.impairment.to_dict()
    if samplers is not None:
        try:
            manifest["sampler_stats"] = samplers.stop()
        except Exception as e:  # never lose the manifest over a sampler
            manifest["sampler_error"] = str(e)
    try:
        net.stop()
    except Exception as e:
        manifest["teardown_error"] = str(e)
    if spec.cluster is not None:  # whether each other server's records came whole, or only as streamed
        manifest.setdefault("cluster", {})["records"] = net.records_report()
    from ..collect.records import start_barrier_s

    start_s = start_barrier_s(trial_dir)
    if cpu is not None:  # the start-up before the barrier fills every core and is no scheme's time: not judged
        t0 = manifest.get("t0_ns")
        manifest["cpu_saturation"] = cpu.record(
            t0 + round(start_s * 1e9) if isinstance(t0, int) and start_s is not None else None)
    if getattr(net, "sampler_stats", None):  # other servers' samplers, known once they stopped
        manifest.setdefault("cluster", {})["remote_sampler_stats"] = net.sampler_stats
        remote_cpu_saturation(manifest, net.remote_cpu_saturation(start_s))
    result.wall_s = time.monotonic() - t_start
    training = manifest.get("training") or {}
    manifest["clock"] = {
        "zero": "start barrier (every process ready)" if start_s is not None else "t0 (no start barrier recorded)",
        "start_barrier_s": start_s,  # seconds after t0: the start-up that no scheme is charged for
        "eval_every_samples": training.get("eval_every_samples"),
        "eval_every_updates": None if training.get("eval_every_samples") else training.get("eval_every", 10),
    }
    unfaithful = faithfulness(manifest)
    if unfaithful:
        say(f"{name}: UNFAITHFUL: " + "; ".join(unfaithful))
    manifest.update({
        "faithful": not unfaithful, "unfaithful_reasons": unfaithful,
        "end": time.time(), "status": result.status, "reason": result.reason,
        "processes": [{"name": p.name, "host": p.host, "role": p.role, "rank": p.rank,
                       "pid": getattr(p.popen, "trainer_pid", p.popen.pid), "returncode": p.returncode, "log": str(p.log.relative_to(trial_dir)),
                       **_process_record(trial_dir, p.name)}
                      for p in procs],
    })
    write_json_atomic(trial_dir / "manifest.json", manifest, indent=2)
    if spec.collectors.trace:
        try:
            _, problems = merge_trial(trial_dir)
            if problems:
                say(f"trace of {trial_dir.name}: " + "; ".join(problems[:3]))
        except Exception as e:
            say(f"trace merge failed for {trial_dir.name}: {e}")


def _prepare_training(spec: ExperimentSpec, training: dict[str, Any], trial_dir: Path) -> dict[str, Any]:
    """Fill in what only the runner knows: the BLP plan of this topology for ``pgcs`` with ``sync: blp``.

    The plan is solved for the real gradient size of one expert (the model is
    built once here to count its parameters), written to ``plan.json`` in the
    trial (the report draws it), and passed inline to every worker.
    """
    scheme = training.get("scheme", {})
    if scheme.get("sync") != "blp" or scheme.get("plan") or scheme.get("plan_file"):
        return training
    from ..planning import plan_blp

    size = gradient_bytes(training)
    plan = plan_blp(spec.topology.dc_graph(), size, path=spec.topology.path)
    write_atomic(trial_dir / "plan.json", plan.to_json())
    training = dict(training)
    training["scheme"] = dict(scheme, plan=json.loads(plan.to_json()))
    return training


def compute_record(training: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``compute``: mode, profile and the label reports print (training.compute)."""
    from ..training.compute import describe
    from ..training.config import validate_training

    tc = validate_training(training)
    return describe(tc.compute, tc.device)


def gradient_bytes(training: dict[str, Any]) -> int:
    """Bytes of one synchronized gradient (one expert's for multi-expert workloads)."""
    from ..training.config import validate_training
    from ..training.workloads import build_workload

    tc = validate_training(training)
    wl = build_workload(tc.workload.name, tc.workload.params, 0)
    if hasattr(wl, "expert_workloads"):
        wl = wl.expert_workloads()[0]
    model = wl.build_model()
    return int(sum(p.numel() * p.element_size() for p in model.parameters()))


class _Monitor(threading.Thread):
    """Live progress line, and the reasons to stop a trial from outside: Ctrl-C, a lost impairment."""

    def __init__(self, sup: Any, trial_dir: Path, label: str, rep: int, show: Callable[..., None],
                 stopped: Callable[[], bool], faults: Callable[[], list[str]], rank0: Path | None = None) -> None:
        super().__init__(name="trial-monitor", daemon=True)
        self.sup, self.trial_dir, self.label, self.rep = sup, trial_dir, label, rep
        self.show, self.stopped, self.faults, self.rank0 = show, stopped, faults, rank0
        self.cause = ""  # "interrupted" | "network"
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            if self.stopped() and not self.cause:
                self.cause = "interrupted"
                self.sup.request_stop("stopped by the user (Ctrl-C)")
            if self.faults() and not self.cause:
                self.cause = "network"
                self.sup.request_stop("the network no longer matches the spec: " + "; ".join(self.faults()))
            loss = _tail_metrics(self.trial_dir).get("loss", "")
            self.show(step=_tail_step(self.rank0), loss=loss[:6] if loss else None)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)


def _result(res: Any, monitor: _Monitor, label: str, rep: int, trial_dir: Path,
            procs: list[ProcInfo], memory: dict[str, dict[str, Any]] | None = None) -> TrialResult:
    codes = {p.name: p.returncode for p in res.procs}
    for p in procs:
        p.returncode = codes.get(p.name, p.popen.poll())
    if res.ok:
        return TrialResult(label, rep, trial_dir, "ok")
    if monitor.cause == "interrupted":
        return TrialResult(label, rep, trial_dir, "interrupted", res.reason)
    status = "timeout" if "timeout" in res.reason.lower() or "timed out" in res.reason.lower() else "failed"
    reason = res.reason
    bad = next((p for p in procs if p.name == res.first_failure), None)
    oom = {n: m for n, m in (memory or {}).items() if m.get("oom_kills")}
    if oom:  # SIGKILLed by the kernel, not by a bug: say which host ran out and its limit
        reason += " | out of memory: " + ", ".join(
            f"{n} hit its memory limit {m['limit'] / 2**20:.0f} MiB (the OOM killer ended {m['oom_kills']} "
            f"process{'es' if m['oom_kills'] > 1 else ''}; raise `memory:` of its DC)" for n, m in sorted(oom.items()))
    if bad is not None and bad.log.exists():
        tail = bad.log.read_text(errors="replace").strip().splitlines()[-3:]
        reason += " | " + " | ".join(tail)
    # A crash takes its peers down within the same poll (their collectives break), so the first
    # failure seen need not be the cause: name every process that failed by itself.
    own = sorted((r for r in res.procs if r.returncode not in (None, 0) and not r.stopped
                  and r.name != res.first_failure), key=lambda r: (r.ended_s or 0.0, r.name))
    if own:
        reason += " | also failed on their own: " + ", ".join(f"{r.name} (status {r.returncode})" for r in own)
    return TrialResult(label, rep, trial_dir, status, reason)


def _stop_all(procs: list[ProcInfo]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.popen.poll() is None]
        for p in alive:
            try:
                p.popen.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in alive):
            time.sleep(0.05)
    for p in procs:
        if p.returncode is None:
            p.returncode = p.popen.poll()


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def host_runtimes(net: Any) -> dict[str, Any]:
    """Per container host: its image (name and id) and the image's Python and torch versions (empty when
    every host is a process host)."""
    from ..network import docker_hosts

    out: dict[str, Any] = {}
    for name in net.plan.nodes:
        cfg = net.docker_config(name)
        if cfg is None:
            continue
        pid = net.container_pid(name)
        out[name] = {"runtime": "docker", "image": cfg.image, "image_id": docker_hosts.image_id(cfg.image),
                     "container": docker_hosts.container_name(name),
                     "mnt_ns": os.readlink(f"/proc/{pid}/ns/mnt") if pid else None, **docker_hosts.versions(name)}
    return out


def _process_record(trial_dir: Path, name: str) -> dict[str, Any]:
    """What the process said it ran on (interpreter, torch, device; training.runtime.process_record)."""
    from ..training.jobs import process_record_path

    try:
        return {"runtime": json.loads(process_record_path(trial_dir, name).read_text())}
    except (OSError, ValueError):
        return {}
