"""Periodic samplers for link counters, qdisc queues and per-process CPU/RSS.

The runner starts these beside a trial (``SamplerSet(...).start()``) and stops
them at the end; they write ``samples/links.jsonl`` and ``samples/procs.jsonl``
in the formats of docs/CONTRACTS.md (``ts`` = ns since the trial's t0).

Why it is built this way:

* Mininet hosts and routers are processes with their own network namespace
  but no name under /var/run/netns.  A :class:`LinkTarget` therefore names the
  namespace by pid (``/proc/<pid>/ns/net``), by path, or by name.  pyroute2
  opens the netlink socket inside that namespace once (it forks a helper
  that calls setns and hands the socket back; measured ~7 ms per namespace);
  the socket then stays bound to the namespace, so each sample is just two
  netlink dumps (links + qdiscs, ~1 ms together on the dev machine) and the
  sampling thread never switches namespaces.
* Sockets are opened inside the sampling thread because pyroute2's sync
  API drives a per-object asyncio loop that must be used from one thread.
* The sampler thread measures its own CPU time (``time.thread_time``), so
  the collector-overhead benchmark can read :meth:`PeriodicSampler.stats`
  instead of guessing.
* Each tick's lines are flushed, so a crashed run keeps everything up to the
  crash (at worst a half-written last line, which the readers skip).
* One last sample is taken on ``stop()`` so cumulative counters cover the
  whole trial.
* A tick's ``ts`` is the monotonic clock mapped to wall time by one offset
  (the trial's clock anchor, ``collect.recorder.clock_anchor``; read once at
  construction without one), as the trainers' spans are: read from the wall
  clock at each tick it drifted from them while NTP slewed it (measured 5 ms/s
  here), and a link sample could land tens of ms off the span it explains.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from traffic_control.files import write_atomic

TC_H_ROOT = 0xFFFFFFFF
DEFAULT_RATE_HZ = 10.0


# --------------------------------------------------------------------------- base


class PeriodicSampler:
    """A background thread that calls :meth:`_sample` at ``rate_hz`` and writes JSON lines.

    Subclasses implement ``_open`` (runs in the thread, before the first
    tick), ``_sample(ts_ns) -> list[dict]`` and ``_close``.
    """

    name = "sampler"

    def __init__(self, out_path: str | os.PathLike[str], t0_ns: int | None = None,
                 rate_hz: float = DEFAULT_RATE_HZ, *, offset_ns: int | None = None) -> None:
        if rate_hz <= 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
        self.out_path = Path(out_path)
        self.t0_ns = time.time_ns() if t0_ns is None else int(t0_ns)
        # wall = perf_counter + offset: the trial's anchor, shared with its trainers' recorders
        self.offset_ns = time.time_ns() - time.perf_counter_ns() if offset_ns is None else int(offset_ns)
        self.rate_hz = float(rate_hz)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._open_error: BaseException | None = None
        self._fh: IO[str] | None = None
        self._ticks = 0
        self._records = 0
        self._overruns = 0
        self._busy_s = 0.0
        self._max_tick_s = 0.0
        self._cpu_s = 0.0
        self._started_at = 0.0
        self._stopped_at = 0.0
        self._errors: dict[str, int] = {}

    # -- public API -----------------------------------------------------------

    def start(self, timeout: float = 10.0) -> PeriodicSampler:
        """Start the thread; returns once the first sample could be taken (or raises)."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.out_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self._thread = threading.Thread(target=self._run, name=f"testbed-{self.name}", daemon=True)
        self._started_at = time.monotonic()
        self._thread.start()
        if not self._ready.wait(timeout):
            self._stop.set()
            raise TimeoutError(f"{self.name}: not ready within {timeout} s")
        if self._open_error is not None:
            self._thread.join(timeout)
            self._fh.close()
            raise self._open_error
        return self

    def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        """Stop sampling (after one final sample) and return :meth:`stats`."""
        if self._thread is None:
            return self.stats()
        self._stop.set()
        self._thread.join(timeout)
        if self._fh is not None and not self._fh.closed:
            self._fh.close()
        self._stopped_at = time.monotonic()
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """Counts and cost: ticks, records, overruns, CPU seconds of the sampler thread."""
        end = self._stopped_at or time.monotonic()
        duration = max(end - self._started_at, 1e-9) if self._started_at else 0.0
        return {
            "sampler": self.name,
            "rate_hz": self.rate_hz,
            "ticks": self._ticks,
            "records": self._records,
            "overruns": self._overruns,
            "duration_s": round(duration, 6),
            "cpu_s": round(self._cpu_s, 6),
            "cpu_fraction": round(self._cpu_s / duration, 6) if duration else 0.0,
            "mean_tick_s": round(self._busy_s / self._ticks, 6) if self._ticks else 0.0,
            "max_tick_s": round(self._max_tick_s, 6),
            "errors": dict(self._errors),
        }

    def __enter__(self) -> PeriodicSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- subclass hooks -------------------------------------------------------

    def _open(self) -> None:  # pragma: no cover - trivial default
        pass

    def _sample(self, ts_ns: int) -> list[dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def _close(self) -> None:  # pragma: no cover - trivial default
        pass

    def _before_final_tick(self) -> None:
        """Runs in the thread once stop() is asked, before the final sample (default: nothing)."""

    # -- machinery ------------------------------------------------------------

    def _error(self, message: str) -> None:
        self._errors[message] = self._errors.get(message, 0) + 1

    def _tick(self) -> None:
        c0 = time.thread_time()
        w0 = time.perf_counter()
        try:
            records = self._sample(time.perf_counter_ns() + self.offset_ns - self.t0_ns)
        except Exception as exc:  # keep sampling; a run must not die of its collector
            records = []
            self._error(f"{type(exc).__name__}: {exc}")
        if records and self._fh is not None:
            self._fh.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
            self._fh.flush()
            self._records += len(records)
        busy = time.perf_counter() - w0
        self._ticks += 1
        self._busy_s += busy
        self._max_tick_s = max(self._max_tick_s, busy)
        self._cpu_s += time.thread_time() - c0

    def _run(self) -> None:
        c0 = time.thread_time()
        try:
            self._open()
        except BaseException as exc:
            self._open_error = exc
            try:
                self._close()
            finally:
                self._ready.set()
            return
        self._cpu_s += time.thread_time() - c0
        self._ready.set()
        period = 1.0 / self.rate_hz
        next_t = time.monotonic()
        try:
            while True:
                delay = next_t - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    break
                if self._stop.is_set():
                    break
                self._tick()
                next_t += period
                late = time.monotonic() - next_t
                if late > 0:  # missed slots: skip them rather than burst to catch up
                    skipped = int(late // period) + 1
                    self._overruns += skipped
                    next_t += skipped * period
            try:
                self._before_final_tick()
            except Exception as exc:  # the final sample is still taken
                self._error(f"{type(exc).__name__}: {exc}")
            self._tick()  # final sample so cumulative counters cover the whole trial
        finally:
            c1 = time.thread_time()
            try:
                self._close()
            finally:
                self._cpu_s += time.thread_time() - c1


# --------------------------------------------------------------------------- links


def netns_path(netns: str | int | None) -> str | None:
    """Normalise a namespace reference: None (own), pid, path, or /var/run/netns name."""
    if netns is None or netns == "":
        return None
    if isinstance(netns, int):
        return f"/proc/{netns}/ns/net"
    if "/" in netns:
        return netns
    return f"/var/run/netns/{netns}"


@dataclass(frozen=True)
class LinkTarget:
    """One interface to sample.

    ``node``: the Mininet node (router) owning the interface; ``link``: the
    direction its egress serves, ``"A->B"``; ``netns``: None for the
    sampler's own namespace, a pid (int), a path like ``/proc/<pid>/ns/net``
    or a named netns.
    """

    node: str
    ifname: str
    link: str
    netns: str | int | None = None

    @classmethod
    def for_pid(cls, node: str, pid: int, ifname: str, link: str) -> LinkTarget:
        return cls(node=node, ifname=ifname, link=link, netns=f"/proc/{int(pid)}/ns/net")


def _root_qdisc_stats(msg: Any) -> tuple[int, int, int]:
    """(backlog bytes, backlog packets, drops) of a qdisc message.

    The root qdisc of an HTB tree accounts the backlog and drops of its
    children, so the root alone describes the interface's queue.
    """
    st2 = msg.get_attr("TCA_STATS2")
    if st2 is not None:
        q = st2.get_attr("TCA_STATS_QUEUE")
        if q is not None:
            return int(q.get("backlog", 0)), int(q.get("qlen", 0)), int(q.get("drops", 0))
    st = msg.get_attr("TCA_STATS")
    if st is not None:
        return int(st.get("backlog", 0)), int(st.get("qlen", 0)), int(st.get("drop", 0))
    return 0, 0, 0


_PID_NS = re.compile(r"^/proc/(\d+)/ns/net$")


def read_proc_net_dev(path: str) -> dict[str, dict[str, int]]:
    """Parse ``/proc/<pid>/net/dev``: per-interface counters of that pid's namespace.

    About 25 times cheaper than a netlink link dump (~0.02 ms against
    ~0.5 ms, most of it pyroute2 decoding attributes), which matters when
    the collectors share two cores with the trainers.
    """
    out: dict[str, dict[str, int]] = {}
    with open(path, encoding="ascii") as fh:
        lines = fh.read().splitlines()[2:]
    for line in lines:
        name, _, rest = line.partition(":")
        f = rest.split()
        if len(f) < 16:
            continue
        out[name.strip()] = {
            "rx_bytes": int(f[0]), "rx_packets": int(f[1]), "rx_dropped": int(f[3]),
            "tx_bytes": int(f[8]), "tx_packets": int(f[9]), "tx_dropped": int(f[11]),
        }
    return out


class _NsHandle:
    """Where one namespace's counters and qdiscs are read from."""

    def __init__(self, ns: str | None, counters: str) -> None:
        from pyroute2 import IPRoute  # imported here: analysis code never needs pyroute2

        self.ns = ns
        self.label = ns or "own netns"
        if ns is not None and not os.path.exists(ns):
            raise FileNotFoundError(f"network namespace {ns} does not exist")
        # flags=0: never create a namespace by accident (pyroute2's default is O_CREAT)
        self.ipr = IPRoute() if ns is None else IPRoute(netns=ns, flags=0)
        self.index_cache: dict[str, int] = {}
        self.index_time = -1e9
        self.procfs: str | None = None
        self.ns_id: tuple[int, int] | None = None
        if counters in ("auto", "procfs"):
            if ns is None:
                self.procfs = "/proc/self/net/dev"
            elif (m := _PID_NS.match(ns)) is not None:
                self.procfs = f"/proc/{m.group(1)}/net/dev"
                st = os.stat(ns)
                self.ns_id = (st.st_dev, st.st_ino)
            elif counters == "procfs":
                raise ValueError(f"{ns}: procfs counters need a pid namespace path")

    def counters(self) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        """(counters by ifname, ifindex by ifname); procfs while the pid still owns the netns."""
        if self.procfs is not None and self._pid_still_there():
            try:
                return read_proc_net_dev(self.procfs), {}
            except OSError:
                pass
        by_name: dict[str, dict[str, int]] = {}
        index: dict[str, int] = {}
        for m in self.ipr.get_links():
            name = m.get_attr("IFLA_IFNAME")
            by_name[name] = m.get_attr("IFLA_STATS64") or m.get_attr("IFLA_STATS") or {}
            index[name] = m["index"]
        return by_name, index

    def indexes(self, targets: list[LinkTarget], roots: dict[int, Any]) -> dict[str, int]:
        """ifname -> ifindex for matching root qdiscs when counters came from procfs.

        Cached; refreshed (at most once a second) when a target's name or its
        index is unknown, e.g. after an interface was re-created.
        """
        stale = any(self.index_cache.get(t.ifname) not in roots for t in targets)
        if stale and time.monotonic() - self.index_time > 1.0:
            self.index_cache = {m.get_attr("IFLA_IFNAME"): m["index"] for m in self.ipr.get_links()}
            self.index_time = time.monotonic()
        return self.index_cache

    def _pid_still_there(self) -> bool:
        if self.ns_id is None:
            return True
        try:
            st = os.stat(self.ns)  # a recycled pid would point at another namespace
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ns_id

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a socket whose namespace vanished: harmless
            self.ipr.close()


class LinkSampler(PeriodicSampler):
    """Samples interface counters and root-qdisc queue state of chosen interfaces.

    One netlink socket per distinct namespace, opened once.  Each tick reads
    counters (``/proc/<pid>/net/dev`` when the namespace is given by pid or is
    our own, else a netlink link dump) and dumps qdiscs once per namespace,
    picking interfaces by name so one that is re-created is picked up again.
    ``counters="netlink"`` forces netlink for counters.
    """

    name = "links"

    def __init__(self, out_path: str | os.PathLike[str], targets: Iterable[LinkTarget],
                 t0_ns: int | None = None, rate_hz: float = DEFAULT_RATE_HZ,
                 counters: str = "auto", *, offset_ns: int | None = None) -> None:
        super().__init__(out_path, t0_ns, rate_hz, offset_ns=offset_ns)
        if counters not in ("auto", "procfs", "netlink"):
            raise ValueError(f"counters must be auto, procfs or netlink, got {counters!r}")
        self.counters = counters
        self.targets = list(targets)
        self._groups: dict[str | None, list[LinkTarget]] = {}
        for t in self.targets:
            self._groups.setdefault(netns_path(t.netns), []).append(t)
        self._handles: dict[str | None, _NsHandle] = {}

    def _open(self) -> None:
        for ns in self._groups:
            self._handles[ns] = _NsHandle(ns, self.counters)

    def _close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles.clear()

    def _sample(self, ts_ns: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ns, targets in self._groups.items():
            h = self._handles.get(ns)
            if h is None:
                continue
            try:
                stats, index = h.counters()
                roots = {q["index"]: q for q in h.ipr.get_qdiscs() if q.get("parent") == TC_H_ROOT}
                if not index:
                    index = h.indexes(targets, roots)
            except Exception as exc:
                self._error(f"{h.label}: {type(exc).__name__}: {exc}")
                continue
            for t in targets:
                s = stats.get(t.ifname)
                if s is None:
                    self._error(f"{t.node}/{t.ifname}: interface not found")
                    continue
                q = roots.get(index.get(t.ifname, -1))
                backlog, qlen, qdrops = _root_qdisc_stats(q) if q is not None else (None, None, None)
                out.append({
                    "ts": ts_ns,
                    "node": t.node,
                    "ifname": t.ifname,
                    "link": t.link,
                    "tx_bytes": int(s.get("tx_bytes", 0)),
                    "tx_packets": int(s.get("tx_packets", 0)),
                    "rx_bytes": int(s.get("rx_bytes", 0)),
                    "rx_packets": int(s.get("rx_packets", 0)),
                    "drops": int(s.get("tx_dropped", 0)) + int(s.get("rx_dropped", 0)),
                    "qdisc_backlog_bytes": backlog,
                    "qdisc_backlog_pkts": qlen,
                    "qdisc_drops": qdrops,
                })
        return out


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ProcTarget:
    """A process to sample and the identity it has in the trial's records."""

    pid: int
    host: str
    role: str
    rank: int


class ProcSampler(PeriodicSampler):
    """Samples CPU% (of one core, may exceed 100) and RSS per process with psutil.

    Targets can be added while running (processes usually start after the
    sampler); a process that exits is dropped silently after its last sample.
    The first ``cpu_percent`` reading of a process is primed on :meth:`add`,
    since psutil's first call always returns 0.
    """

    name = "procs"

    def __init__(self, out_path: str | os.PathLike[str], targets: Iterable[ProcTarget] = (),
                 t0_ns: int | None = None, rate_hz: float = DEFAULT_RATE_HZ, *,
                 offset_ns: int | None = None) -> None:
        super().__init__(out_path, t0_ns, rate_hz, offset_ns=offset_ns)
        self._lock = threading.Lock()
        self._procs: dict[int, tuple[ProcTarget, Any]] = {}
        self.exited: list[ProcTarget] = []
        for t in targets:
            self.add(t)

    def add(self, target: ProcTarget) -> bool:
        """Start sampling ``target``; False if the process no longer exists."""
        import psutil

        try:
            p = psutil.Process(target.pid)
            p.cpu_percent(None)
        except psutil.Error:
            self._error(f"pid {target.pid} ({target.host}): not running when added")
            return False
        with self._lock:
            self._procs[target.pid] = (target, p)
        return True

    def remove(self, pid: int) -> None:
        with self._lock:
            self._procs.pop(pid, None)

    def _sample(self, ts_ns: int) -> list[dict[str, Any]]:
        import psutil

        with self._lock:
            items = list(self._procs.items())
        out: list[dict[str, Any]] = []
        for pid, (t, p) in items:
            try:
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped: no memory to report
                        raise psutil.ZombieProcess(pid)
                    cpu = p.cpu_percent(None)
                    rss = p.memory_info().rss
            except psutil.Error:  # exited (or zombie): stop sampling it
                self.remove(pid)
                self.exited.append(t)
                continue
            out.append({
                "ts": ts_ns, "host": t.host, "role": t.role, "rank": t.rank,
                "pid": pid, "cpu_percent": round(cpu, 2), "rss_bytes": int(rss),
            })
        return out


# --------------------------------------------------------------------------- both


class SamplerSet:
    """The samplers of one trial (links, TCP connections, processes), writing under ``<trial_dir>/samples/``.

    ``start()``/``stop()`` are what the runner and the overhead benchmark
    call; ``stop()`` returns both samplers' stats and also writes them to
    ``samples/sampler_stats.json`` so the overhead can be read after the fact.  ``suffix`` goes into every
    file's name (``links-s2.jsonl``): another server's samplers, whose files join the launcher's.
    """

    def __init__(self, trial_dir: str | os.PathLike[str], t0_ns: int,
                 links: Iterable[LinkTarget] = (), procs: Iterable[ProcTarget] = (),
                 rate_hz: float = DEFAULT_RATE_HZ, proc_rate_hz: float | None = None,
                 tcp: Iterable[Any] = (), suffix: str = "", offset_ns: int | None = None) -> None:
        from .tcp_sampler import TcpSampler

        if offset_ns is None:  # one mapping for the three samplers, at least
            offset_ns = time.time_ns() - time.perf_counter_ns()

        samples = Path(trial_dir) / "samples"
        links = list(links)
        tcp = list(tcp)
        self.links = LinkSampler(samples / f"links{suffix}.jsonl", links, t0_ns, rate_hz,
                                 offset_ns=offset_ns) if links else None
        self.tcp = TcpSampler(samples / f"tcp{suffix}.jsonl", tcp, t0_ns, rate_hz, offset_ns=offset_ns) if tcp else None
        self.procs = ProcSampler(samples / f"procs{suffix}.jsonl", procs, t0_ns, proc_rate_hz or rate_hz,
                                 offset_ns=offset_ns)
        self.stats_path = samples / f"sampler_stats{suffix}.json"

    def start(self) -> SamplerSet:
        started: list[PeriodicSampler] = []
        try:
            for s in (self.links, self.tcp, self.procs):
                if s is not None:
                    s.start()
                    started.append(s)
        except BaseException:
            for s in started:
                s.stop()
            raise
        return self

    def add_process(self, target: ProcTarget) -> bool:
        return self.procs.add(target)

    def stop(self) -> dict[str, Any]:
        stats = {"procs": self.procs.stop()}
        if self.links is not None:
            stats["links"] = self.links.stop()
        if self.tcp is not None:
            stats["tcp"] = self.tcp.stop()
        with contextlib.suppress(OSError):
            write_atomic(self.stats_path, json.dumps(stats, indent=2) + "\n")
        return stats

    def __enter__(self) -> SamplerSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- as a process


def _from_config(cfg: dict[str, Any]) -> SamplerSet:
    links = [LinkTarget(**d) for d in cfg.get("links", [])]
    procs = [ProcTarget(**d) for d in cfg.get("procs", [])]
    return SamplerSet(cfg["trial_dir"], int(cfg["t0_ns"]), links, procs,
                      float(cfg.get("rate_hz", DEFAULT_RATE_HZ)), cfg.get("proc_rate_hz"))


def example_config() -> dict[str, Any]:
    """The JSON accepted by ``python -m testbed.collect.samplers CONFIG``."""
    return {
        "trial_dir": "results/exp/run/trials/gsyn-r0",
        "t0_ns": 0,
        "rate_hz": DEFAULT_RATE_HZ,
        "links": [asdict(LinkTarget("r_dc1", "r_dc1-eth1", "dc1->dc2", "/proc/1234/ns/net"))],
        "procs": [asdict(ProcTarget(2345, "h_dc1_0", "worker", 0))],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the samplers as their own process until SIGTERM/SIGINT (keeps them off the runner's GIL)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m testbed.collect.samplers CONFIG.json\nexample config:\n"
              + json.dumps(example_config(), indent=2), file=sys.stderr)
        return 2
    cfg = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    sset = _from_config(cfg).start()
    try:
        while not done.wait(1.0):
            pass
    finally:
        sset.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
