"""Cross-traffic generator and sink: background flows over the emulated WAN (stdlib only).

Runs inside a DC's cross-traffic endpoint (``<dc>-xt``, see
:mod:`testbed.network.cross_traffic`).  One ``sink`` per destination DC
accepts every flow into it; one ``send`` per source DC runs every flow out of
it, each in its own thread.  Both write JSON lines (``ts`` in ns on the
machine's realtime clock, the trial's clock) to ``--out`` (``-``: stdout, after its ``ready`` line; how the
records of an endpoint on another server come back, over its ssh channel):

* ``rx``: a flow's payload bytes delivered so far, every ``--interval`` s (sink);
* ``state``: a flow turned on or off (sender);
* ``short``: one short flow finished: its size and flow completion time, from
  the first SYN to the sink's close after the last byte (sender);
* ``error``: a flow failed (connection refused, reset), with the reason.

Why its own generator and not iperf3: a flow's delivered bytes must be read per
interval by the receiver (not the sender's written bytes), short flows need a
completion time each, and on/off and Poisson arrivals are schedules iperf3 has
no notion of.  A paced TCP flow uses the kernel's own pacing
(``SO_MAX_PACING_RATE``, TCP's internal pacing since Linux 4.13), so the rate
costs no userspace timer; a UDP flow is sent at its rate by a clock of its own
(unresponsive traffic: it never yields to congestion).

Flow header: the first 4 bytes of a TCP connection, and of every UDP datagram,
carry the flow's index (big-endian u32), so one sink serves every flow.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
HEADER = struct.Struct("!I")
#: IP + UDP headers: a UDP flow's rate counts whole IP packets, as a link's rate does.
UDP_IP_HEADERS = 28
#: IP + TCP headers of a data segment with timestamps (Linux's default).
TCP_IP_HEADERS = 52
CHUNK = 64 * 1024
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
#: Unsent bytes a greedy bulk flow keeps queued in its socket (writes block above it).
NOTSENT_LOWAT = 128 * 1024


class Log:
    """JSON lines to one file (``-``: stdout), one write per line, from any thread."""

    def __init__(self, path: str) -> None:
        if path == "-":
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            self._fh: Any = sys.stdout
        else:
            self._fh = open(path, "a", buffering=1)  # noqa: SIM115  (closed by close())
        self._lock = threading.Lock()

    def write(self, **rec: Any) -> None:
        rec.setdefault("ts", time.time_ns())
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self._lock:
            self._fh.write(line)

    def close(self) -> None:
        with self._lock:
            if self._fh is sys.stdout:
                self._fh.flush()
            else:
                self._fh.close()


# --------------------------------------------------------------------------- sink
def sink(args: argparse.Namespace, stop: threading.Event) -> int:
    flows = json.loads(args.flows)
    log = Log(args.out)
    delivered: dict[int, int] = {}
    lock = threading.Lock()

    def add(idx: int, n: int) -> None:
        with lock:
            delivered[idx] = delivered.get(idx, 0) + n

    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((args.bind, args.port))
    tcp.listen(256)
    tcp.settimeout(0.2)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
    udp.bind((args.bind, args.port))
    udp.settimeout(0.2)

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                head = b""
                while len(head) < HEADER.size:
                    more = conn.recv(HEADER.size - len(head))
                    if not more:
                        return
                    head += more
                (idx,) = HEADER.unpack(head)
                while True:
                    data = conn.recv(CHUNK)
                    if not data:
                        return  # EOF: close, which is the short flow's completion signal
                    add(idx, len(data))
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = tcp.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    def datagrams() -> None:
        buf = bytearray(65536)
        while not stop.is_set():
            try:
                n = udp.recv_into(buf)
            except TimeoutError:
                continue
            except OSError:
                return
            if n >= HEADER.size:
                add(HEADER.unpack_from(buf)[0], n - HEADER.size)

    threads = [threading.Thread(target=f, daemon=True) for f in (accept, datagrams)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    last: dict[int, int] = {}

    def report() -> None:
        with lock:
            now = dict(delivered)
        for idx, total in sorted(now.items()):
            if last.get(idx) != total and 0 <= idx < len(flows):
                log.write(kind="rx", flow=flows[idx], bytes=total)
                last[idx] = total

    while not stop.wait(args.interval):
        report()
    report()
    log.close()
    return 0


# --------------------------------------------------------------------------- senders
def _connect(dst: str, port: int, idx: int, rate_bps: float | None, mtu: int = 1500) -> socket.socket:
    """A TCP connection to the sink for flow ``idx``, paced so that its IP packets carry ``rate_bps``.

    The kernel paces payload bytes (``skb->len`` before headers), so the pacing rate is the IP
    rate times the payload share of a full packet (``mtu - 52`` of ``mtu``: IP + TCP with timestamps).
    Little unsent data stays in the socket (``TCP_NOTSENT_LOWAT``: 20 ms of the rate, 128 KiB
    greedy), so an "off" stops the flow within that, not a full send buffer later.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lowat = max(16 * 1024, int(rate_bps / 8 * 0.02)) if rate_bps else NOTSENT_LOWAT
    s.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, lowat)
    if rate_bps:
        pacing = rate_bps / 8 * (mtu - TCP_IP_HEADERS) / mtu
        s.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, max(1, int(pacing)))
    s.settimeout(10)
    s.connect((dst, port))
    s.settimeout(None)
    s.sendall(HEADER.pack(idx))
    return s


def _windows(flow: dict[str, Any], t0: float, stop: threading.Event) -> Any:
    """(start, end) wall-clock windows in which the flow sends, until its end or ``stop``."""
    start = t0 + flow.get("start_s", 0.0)
    end = start + flow["duration_s"] if flow.get("duration_s") else float("inf")
    if flow["pattern"] != "on_off":
        yield start, end
        return
    t = start
    while t < end and not stop.is_set():
        yield t, min(t + flow["on_s"], end)
        t += flow["on_s"] + flow["off_s"]


def _wait_until(t: float, stop: threading.Event) -> bool:
    """Sleep until wall-clock ``t``; False if stopped first."""
    while True:
        left = t - time.time()
        if left <= 0:
            return not stop.is_set()
        if stop.wait(min(left, 0.5)):
            return False


def bulk_tcp(flow: dict[str, Any], idx: int, args: argparse.Namespace, log: Log, t0: float,
             stop: threading.Event) -> None:
    """constant / on_off over TCP: one connection, paced at ``rate`` (greedy without one), idle when off."""
    sock = None
    buf = b"\0" * CHUNK
    try:
        for start, end in _windows(flow, t0, stop):
            if not _wait_until(start, stop):
                break
            if sock is None:
                sock = _connect(args.dst, args.port, idx, flow.get("rate_bps"), args.mtu)
                sock.settimeout(0.2)
            log.write(kind="state", flow=flow["label"], on=True)
            while not stop.is_set() and time.time() < end:
                try:
                    sock.send(buf)
                except TimeoutError:
                    continue
            log.write(kind="state", flow=flow["label"], on=False)
    except OSError as e:
        log.write(kind="error", flow=flow["label"], error=f"{type(e).__name__}: {e}")
    finally:
        if sock is not None:
            sock.close()


def bulk_udp(flow: dict[str, Any], idx: int, args: argparse.Namespace, log: Log, t0: float,
             stop: threading.Event) -> None:
    """constant / on_off over UDP at ``rate`` (IP packets, headers included), by its own clock."""
    payload = max(HEADER.size, args.mtu - UDP_IP_HEADERS)
    gap = (payload + UDP_IP_HEADERS) * 8 / flow["rate_bps"]
    dgram = HEADER.pack(idx) + b"\0" * (payload - HEADER.size)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 2**20)
    try:
        for start, end in _windows(flow, t0, stop):
            if not _wait_until(start, stop):
                break
            log.write(kind="state", flow=flow["label"], on=True)
            due = time.monotonic()
            stop_at = due + (end - time.time())
            while not stop.is_set():
                now = time.monotonic()
                if now >= stop_at:
                    break
                if due > now + 0.001:
                    time.sleep(due - now)
                    continue
                try:
                    s.sendto(dgram, (args.dst, args.port))
                except OSError:  # a full socket buffer (ENOBUFS): the datagram is lost, as on a NIC
                    pass
                due = max(due + gap, now - 0.05)  # a late sender catches up at most 50 ms of backlog
            log.write(kind="state", flow=flow["label"], on=False)
    finally:
        s.close()


def short_flows(flow: dict[str, Any], idx: int, args: argparse.Namespace, log: Log, t0: float,
                stop: threading.Event) -> None:
    """Poisson arrivals of ``size``-byte TCP flows; each records its completion time."""
    rng = random.Random(f"{args.seed}:{flow['label']}")
    (start, end), = list(_windows(flow, t0, stop))
    active = threading.Semaphore(flow["max_concurrent"])
    count = [0, 0]  # started, skipped (too many still running)

    def one(n: int) -> None:
        t_start = time.time_ns()
        try:
            s = _connect(args.dst, args.port, idx, None)
            with s:
                left = flow["size_bytes"]
                buf = b"\0" * min(CHUNK, left)
                while left > 0:
                    sent = s.send(buf[:left])
                    left -= sent
                s.shutdown(socket.SHUT_WR)
                s.settimeout(max(30.0, args.timeout))
                while s.recv(4096):
                    pass
            log.write(kind="short", flow=flow["label"], n=n, start=t_start, bytes=flow["size_bytes"],
                      fct_s=(time.time_ns() - t_start) / 1e9)
        except OSError as e:
            log.write(kind="error", flow=flow["label"], n=n, error=f"{type(e).__name__}: {e}")
        finally:
            active.release()

    if not _wait_until(start, stop):
        return
    t = time.time()
    log.write(kind="state", flow=flow["label"], on=True)
    while not stop.is_set():
        t += rng.expovariate(flow["arrival_rate"])
        if t >= end or not _wait_until(t, stop):
            break
        if not active.acquire(blocking=False):
            count[1] += 1
            continue
        count[0] += 1
        threading.Thread(target=one, args=(count[0],), daemon=True).start()
    log.write(kind="state", flow=flow["label"], on=False, started=count[0], skipped=count[1])
    # flows still running finish (or fail) on their own; the runner's stop ends the process


RUNNERS = {("constant", "tcp"): bulk_tcp, ("on_off", "tcp"): bulk_tcp, ("constant", "udp"): bulk_udp,
           ("on_off", "udp"): bulk_udp, ("short_flows", "tcp"): short_flows}


def send(args: argparse.Namespace, stop: threading.Event) -> int:
    """Every flow of this source DC (``--flows``: [{index, flow}...]) in its own thread."""
    log = Log(args.out)
    t0 = args.t0_ns / 1e9
    threads = []
    for item in json.loads(args.flows):
        flow = item["flow"]
        fn = RUNNERS[(flow["pattern"], flow["protocol"])]
        threads.append(threading.Thread(target=fn, args=(flow, item["index"], args, log, t0, stop), daemon=True))
    print("ready", flush=True)  # before the flows log (with --out -, a record could split this line)
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive() and not stop.is_set():
            t.join(0.2)
    if stop.is_set():
        for t in threads:
            t.join(2.0)
    elif any(f["flow"]["pattern"] == "short_flows" for f in json.loads(args.flows)):
        stop.wait(args.timeout)  # let the last short flows complete; the runner's stop ends it sooner
    log.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("sink", "send"))
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--dst", default="")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--flows", required=True, help="JSON: sink: flow labels by index; send: [{index, flow}]")
    p.add_argument("--out", required=True)
    p.add_argument("--t0-ns", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return sink(args, stop) if args.mode == "sink" else send(args, stop)


if __name__ == "__main__":
    sys.exit(main())
