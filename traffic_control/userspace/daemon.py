"""The per-interface impairment daemon: one process, one queue, one event loop.

Runs inside the router's network namespace (``python -m
traffic_control.userspace run ...``).  One thread does everything, because
in CPython a second thread would only contend for the GIL:

    select(queue socket, signal pipe; timeout = next release or heartbeat)
    -> read up to 64 packet ids, stamp them, admit (loss) or schedule them
    -> release every packet now due, as one batch verdict when in order
    -> one send for all verdicts of this turn; heartbeat every 100 ms

``select`` takes a microsecond timeout (``poll``/``epoll`` round up to
milliseconds) and the timer slack is set to 1 us, so releases are late by
wake-up latency only; the daemon measures that lateness and reports it.  It
wakes up to 100 us early and spins the rest (capped at 2 % of a core), and
asks for SCHED_FIFO (best effort), so that trainers competing for the same
cores do not add their time slices to the emulated delay.

Arrival is stamped after the read, so time a packet waited in the socket
buffer is added to, never subtracted from, its delay: the minimum delay is
never below the spec.

Faults and stops: an impairment belongs to the network it shapes, not to
the command that started it, so no signal alone makes the link unimpaired.
SIGTERM/SIGINT end the daemon *fail closed* (rules stay in place, held packets
are dropped as the queue unbinds, the kernel drops the link's traffic until
someone cleans up), exactly like a crash or SIGKILL.  Only an orderly stop
asked for by the controller (the file ``stop`` in the state directory, then
SIGTERM), or the parent going away when ``--parent-pid`` was given (library
use), removes the rules and releases the held packets.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from traffic_control import files

from . import rules
from .schedule import Scheduler
from .shape import ImpairmentShape

HEARTBEAT_S = 0.1
RECV_BATCH = 64
#: Wake this many microseconds before a release and busy-wait the rest: the
#: wake-up latency of a sleeping thread is tens of microseconds (about 75 us
#: after a 20 ms sleep in the measurement VM, ~30 us after 1 ms).
SPIN_US = 100.0
#: ...but spin at most this share of one core: at thousands of releases per
#: second (HTB-paced bulk flows) an unbounded spin cost ~20 % of a core for
#: nothing, while under load the loop is awake anyway.
SPIN_BUDGET = 0.02
PR_SET_TIMERSLACK = 29
RT_PRIORITY = 10

HEALTH_FILE = "health.json"
SHAPE_FILE = "shape.json"
#: Written by the controller before SIGTERM to ask for an orderly stop (rules removed, packets released).
STOP_FILE = "stop"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Readers never see a half-written file (health is rewritten often: no fsync)."""
    files.write_json_atomic(path, data, durable=False, sort_keys=True)


def read_shape_file(path: Path) -> tuple[int, ImpairmentShape]:
    """``(generation, shape)`` from the file the controller writes."""
    data = json.loads(path.read_text())
    return int(data["generation"]), ImpairmentShape.from_dict(data["shape"])


def kernel_queue_stats(queue: int) -> dict[str, int]:
    """This namespace's kernel counters for ``queue`` (held, queue-full and socket drops)."""
    try:
        lines = Path("/proc/net/netfilter/nfnetlink_queue").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        cols = line.split()
        if len(cols) >= 8 and cols[0] == str(queue):
            return {"kernel_held": int(cols[2]), "kernel_queue_dropped": int(cols[5]),
                    "kernel_user_dropped": int(cols[6]), "kernel_id_sequence": int(cols[7])}
    return {}


def _set_timer_slack(ns: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_realtime(priority: int) -> str:
    """Best-effort SCHED_FIFO; returns what the daemon runs under (for the health file).

    Why: on two cores shared with trainers, a normally scheduled daemon was
    measured releasing 310 us late on average (max 7.9 ms) at load 10;
    SCHED_FIFO 10 gave 11 us (max 0.7 ms).  The loop blocks in ``select`` and
    its spin is capped (``SPIN_BUDGET``), and the kernel's RT throttling
    leaves others at least 5 % of each core, so it cannot lock a CPU.
    Containers without CAP_SYS_NICE refuse it; the daemon then runs normally.
    """
    if priority <= 0:
        return "other"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        return f"other (SCHED_FIFO refused: {exc.strerror})"
    return f"fifo:{priority}"


def rcvbuf_for(limit: int) -> int:
    """Socket buffer that holds ``limit`` metadata messages (~1 KiB truesize each).

    Then the queue limit, like netem's, is the one bound on what is held: a
    packet is dropped when the kernel queue is full (``kernel_queue_dropped``),
    not earlier because the socket overflowed (``kernel_user_dropped``).
    """
    return min(max(1 << 20, limit * 1024), 256 << 20)


def open_queue(mechanism: str, queue: int, maxlen: int, gso: bool, batch: bool, rcvbuf: int) -> Any:
    """The queue object for ``mechanism`` (``netlink`` or ``binding``)."""
    if mechanism == "netlink":
        from .nfq import NetlinkQueue

        return NetlinkQueue(queue, maxlen=maxlen, gso=gso, batch=batch, rcvbuf=rcvbuf)
    if mechanism == "binding":
        from .binding import BindingQueue

        return BindingQueue(queue, maxlen=maxlen)
    raise ValueError(f"unknown mechanism {mechanism!r}")


class Daemon:
    """State of one running impairment: queue, scheduler, counters, health file."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.state_dir = Path(opts.state_dir)
        self.health_path = self.state_dir / HEALTH_FILE
        self.shape_path = self.state_dir / SHAPE_FILE
        self.generation, self.shape = read_shape_file(self.shape_path)
        self.ifname: str = opts.ifname
        self.queue_num: int = opts.queue if opts.queue is not None else socket.if_nametoindex(self.ifname)
        self.queue: Any = None
        self.sched = Scheduler(self.shape)
        self.state = "starting"
        self.error: str | None = None
        self.stop_requested = False
        self.reload_requested = False
        self.counters = {"received": 0, "released": 0, "lost": 0, "max_held": 0,
                         "late_count": 0, "late_sum_us": 0.0, "late_max_us": 0.0, "spin_s": 0.0,
                         "backlog_max": 0}
        self.last_id = 0
        self.late_hist = [0] * 16  # bucket k: lateness < 2**k microseconds (last: the rest)
        self.started = time.time()
        self.sched_policy = "other"

    # --------------------------------------------------------------- health
    def health(self) -> dict[str, Any]:
        c = self.counters
        cpu = os.times()
        stats = dict(c)
        stats["held"] = len(self.sched)
        stats["late_mean_us"] = c["late_sum_us"] / c["late_count"] if c["late_count"] else 0.0
        stats["late_hist_log2_us"] = list(self.late_hist)
        stats["cpu_s"] = cpu.user + cpu.system
        if self.queue is not None:
            stats.update(self.queue.stats)
            kernel = kernel_queue_stats(self.queue_num)
            if kernel:
                # Messages the kernel sent that we have not read yet: time they
                # wait there is added to their delay (the daemon is the bottleneck).
                backlog = (kernel["kernel_id_sequence"] - self.last_id) % 2**32 if c["received"] else 0
                c["backlog_max"] = max(c["backlog_max"], backlog)
                stats.update(kernel, backlog=backlog, backlog_max=c["backlog_max"])
        return {"pid": os.getpid(), "state": self.state, "error": self.error, "time": time.time(),
                "started": self.started, "ifname": self.ifname, "queue": self.queue_num,
                "mechanism": self.opts.mechanism, "generation": self.generation, "sched": self.sched_policy,
                "shape": self.shape.to_dict(), "stats": stats}

    def write_health(self) -> None:
        write_json_atomic(self.health_path, self.health())

    # --------------------------------------------------------------- control
    def _on_stop(self, _signum: int, _frame: Any) -> None:
        self.stop_requested = True

    def _on_reload(self, _signum: int, _frame: Any) -> None:
        self.reload_requested = True

    def reload(self) -> None:
        """Apply the shape file's current contents (controller wrote it, then sent SIGHUP)."""
        self.reload_requested = False
        try:
            generation, shape = read_shape_file(self.shape_path)
        except Exception as exc:  # keep running on the old shape; the controller sees the error
            self.error = f"shape reload failed: {exc}"
            return
        if shape.limit != self.shape.limit:
            self.queue.set_maxlen(shape.limit, self.opts.rcvbuf or rcvbuf_for(shape.limit))
        self.sched.set_shape(shape)
        self.shape, self.generation, self.error = shape, generation, None

    # --------------------------------------------------------------- main
    def run(self) -> int:
        opts = self.opts
        _set_timer_slack(1000)
        self.sched_policy = set_realtime(opts.rt_priority)
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        try:
            # Bind first: if the queue is taken (another daemon on this
            # interface), fail before touching anyone's rules.
            self.queue = open_queue(opts.mechanism, self.queue_num, self.shape.limit,
                                    not opts.no_gso, not opts.no_batch, opts.rcvbuf or rcvbuf_for(self.shape.limit))
            rules.remove(ifname=self.ifname)  # a crashed predecessor's rules
            try:
                rules.install(self.ifname, self.queue_num)
                self.state = "running"
                self.write_health()
            except BaseException:
                rules.remove(ifname=self.ifname)  # never started: leave nothing behind
                raise
            orderly = self._loop(rfd)
        except Exception:
            # Fail closed: rules stay, the queue unbinds as we exit, the
            # kernel drops this link's packets until someone cleans up.
            self.state = "failed"
            self.error = traceback.format_exc(limit=8)
            self._safe_health()
            if self.queue is not None:
                self.queue.close()
            print(self.error, file=sys.stderr)
            return 1
        if not orderly:
            # Terminated without being asked to stop: fail closed, as after a crash.
            self.state = "terminated"
            self.error = "terminated by a signal without an orderly stop request: the link fails closed"
            self._safe_health()
            self.queue.close()
            print(self.error, file=sys.stderr)
            return 1
        self.state = "stopping"
        self._safe_health()
        rules.remove(ifname=self.ifname)
        released: list[int] = []
        self.sched.pop_all(released)
        self.queue.accept(released, False)
        self.queue.flush()
        self.queue.close()
        self.state = "stopped"
        self._safe_health()
        return 0

    def _safe_health(self) -> None:
        with contextlib.suppress(OSError):
            self.write_health()

    def stop_is_orderly(self) -> bool:
        """Whether the controller asked for this stop (and so for the rules to go)."""
        return (self.state_dir / STOP_FILE).exists()

    def _loop(self, wake_fd: int) -> bool:
        """Run until a stop; returns True for an orderly one (asked for, or the parent gone)."""
        queue, sched, counters, hist = self.queue, self.sched, self.counters, self.late_hist
        qfd = queue.fileno()
        fds = [qfd, wake_fd]
        mono = time.monotonic
        parent = self.opts.parent_pid
        spin = self.opts.spin_us * 1e-6
        budget = SPIN_BUDGET * HEARTBEAT_S
        spent = 0.0
        next_beat = mono() + HEARTBEAT_S
        ids: list[int] = []
        out: list[int] = []
        while not self.stop_requested:
            now = mono()
            due = sched.next_due()
            release = due is not None and due <= next_beat
            deadline = due if release else next_beat
            wait = deadline - now
            lead = spin if release and spent < budget else 0.0
            if wait > lead:
                ready = select.select(fds, (), (), wait - lead)[0]
            else:
                if wait > 0:  # the last few microseconds: no wake-up latency
                    while mono() < deadline:
                        pass
                    spent += mono() - now
                ready = select.select(fds, (), (), 0)[0]
            if wake_fd in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_fd, 512)
                if self.reload_requested:
                    self.reload()
            if qfd in ready:
                queue.receive(RECV_BATCH, ids)
                if ids:
                    now = mono()
                    counters["received"] += len(ids)
                    self.last_id = ids[-1]
                    dropped = [i for i in ids if not sched.admit(i, now)]
                    if dropped:
                        queue.drop(dropped)
                        counters["lost"] += len(dropped)
                    ids.clear()
                    held = len(sched)
                    if held > counters["max_held"]:
                        counters["max_held"] = held
            now = mono()
            first = sched.next_due()
            if first is not None and first <= now:
                late_us = (now - first) * 1e6
                counters["late_count"] += 1
                counters["late_sum_us"] += late_us
                if late_us > counters["late_max_us"]:
                    counters["late_max_us"] = late_us
                hist[min(15, int(late_us).bit_length())] += 1
                batchable = sched.pop_due(now, out)
                queue.accept(out, batchable)
                counters["released"] += len(out)
                out.clear()
            queue.flush()
            if now >= next_beat:
                next_beat = now + HEARTBEAT_S
                counters["spin_s"] += spent
                spent = 0.0
                self.write_health()
                if parent and os.getppid() != parent:
                    return True
        return self.stop_is_orderly()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m traffic_control.userspace run",
                                description="Hold an interface's egress packets in userspace (delay/jitter/loss).")
    p.add_argument("--ifname", required=True, help="egress interface in this network namespace")
    p.add_argument("--queue", type=int, default=None, help="NFQUEUE number (default: the ifindex)")
    p.add_argument("--state-dir", required=True, help=f"holds {SHAPE_FILE} (input) and {HEALTH_FILE} (output)")
    p.add_argument("--mechanism", choices=("netlink", "binding"), default="netlink")
    p.add_argument("--no-gso", action="store_true", help="let the kernel segment GSO packets (benchmark only)")
    p.add_argument("--no-batch", action="store_true", help="one verdict message per packet (benchmark only)")
    p.add_argument("--rcvbuf", type=int, default=0,
                   help="netlink receive buffer bytes (default: enough for the queue limit)")
    p.add_argument("--rt-priority", type=int, default=RT_PRIORITY,
                   help="SCHED_FIFO priority, best effort (0: normal scheduling)")
    p.add_argument("--spin-us", type=float, default=SPIN_US,
                   help="wake this early and busy-wait to the release time (hides wake-up latency)")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="stop (orderly: rules removed, packets released) when this parent goes away; "
                        "default 0: the daemon outlives whoever started it")
    return p


def main(argv: list[str] | None = None) -> int:
    return Daemon(parser().parse_args(argv)).run()
