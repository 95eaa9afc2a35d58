"""A UDP packet train: the short rate probe of the per-trial self-test (stdlib only).

Run inside a node (``python -I -S udp_train.py ...``: no site packages, so it
starts in ~20 ms, not the ~1 s of the testbed's imports)::

    udp_train.py recv BIND_IP PORT WAIT_S SKIP             prints "ready", then one JSON line
    udp_train.py send DST_IP PORT RATE_BPS SECONDS BURST_PKTS

The receiver ends 0.15 s after the last arrival once its stdin says the
sender is done (a line, or EOF), or after WAIT_S in all (see :func:`recv`).
The sender first sends ``BURST_PKTS`` datagrams back to back (enough to
spend the HTB class's burst allowance, which the caller passes, and leave a
queue), then paces full-size datagrams (1472 payload bytes: 1500-byte IP
packets, 1514-byte Ethernet frames, what the link's HTB counts) at
``RATE_BPS`` of frames until ``SECONDS``; the caller asks for more than the
link's rate, so the shaper's queue stays busy and drops the excess.  The
receiver takes kernel arrival stamps (``SO_TIMESTAMPNS``: the time the frame
arrived, not when Python read it), skips the first ``SKIP`` arrivals and a
tenth of the rest (the burst, which HTB lets through faster than the rate),
and estimates the rate the link released frames at as the median over
windows of 50 consecutive arrivals of ``49 * frame_bytes * 8 / window
span``: a window in which the sender was descheduled long enough for the
queue to run dry reads low, and the median ignores it.  A train, not a TCP
flow: TCP needs many RTTs to reach a 200 ms-RTT link's rate, a train shows
the shaper's rate in a tenth of a second, and it shows a link that is
*faster* than its spec too (a missing shaper), which TCP goodput cannot.

Both sockets get 8 MiB buffers (``SO_*BUFFORCE``, root): the userspace
impairment holds a sender's datagrams for the link's delay, charged to the
sending socket, and a default 212 KiB buffer would cap the train at
212 KiB / delay.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time

PAYLOAD = 1472
FRAME_BYTES = PAYLOAD + 8 + 20 + 14  # UDP + IPv4 + Ethernet headers: 1514
SKIP_FRACTION = 0.10
WINDOW = 50
IDLE_END_S = 0.15
BUF = 8 << 20
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE, _SO_TIMESTAMPNS = 32, 33, 35


def _bufs(s: socket.socket) -> None:
    for force, plain in ((_SO_SNDBUFFORCE, socket.SO_SNDBUF), (_SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        try:
            s.setsockopt(socket.SOL_SOCKET, force, BUF)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, plain, BUF)


def estimate(stamps_ns: list[int], skip: int = 0, frame_bytes: int = FRAME_BYTES) -> dict[str, float | int | None]:
    """Release rate (bit/s of frames) from arrival stamps: ``skip`` and a tenth of the rest dropped,
    the median over windows of :data:`WINDOW` arrivals (the whole span with fewer than 3 windows)."""
    stamps = sorted(stamps_ns)
    k = min(len(stamps), skip) + int(max(0, len(stamps) - skip) * SKIP_FRACTION)
    used = stamps[k:]
    if len(used) < 10 or used[-1] <= used[0]:
        return {"received": len(stamps), "used": len(used), "rate_bps": None}
    span = (used[-1] - used[0]) / 1e9
    overall = (len(used) - 1) * frame_bytes * 8 / span
    rates = [(WINDOW - 1) * frame_bytes * 8 / ((used[i + WINDOW - 1] - used[i]) / 1e9)
             for i in range(0, len(used) - WINDOW + 1, WINDOW) if used[i + WINDOW - 1] > used[i]]
    if len(rates) >= 3:
        rates.sort()
        mid = len(rates) // 2
        rate = rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2
    else:
        rate = overall
    return {"received": len(stamps), "used": len(used), "span_s": span, "windows": len(rates),
            "overall_bps": overall, "rate_bps": rate}


def recv(bind_ip: str, port: int, wait_s: float, skip: int) -> dict[str, float | int | None]:
    """Stamp arrivals until :data:`IDLE_END_S` without one *after* the caller said the sender is done
    (a line on stdin, or its end), or ``wait_s`` in all if it never does; a descheduled sender's
    pause mid-train is not its end (as :func:`owd_train.recv`, whose loop this mirrors: each probe
    runs as a lone ``python -I -S`` script and imports nothing of the package)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _bufs(s)
    s.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    s.bind((bind_ip, port))
    sel = selectors.DefaultSelector()
    try:
        sel.register(sys.stdin, selectors.EVENT_READ)
        sender_done = False
    except (AttributeError, ValueError, OSError):  # no stdin that can say it: idle from the first arrival
        sender_done = True
    sel.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    stamps: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if not sender_done and left <= 0:
            break
        events = sel.select((IDLE_END_S if stamps else max(IDLE_END_S, left)) if sender_done else left)
        if not events:
            break
        for key, _ in events:
            if key.fileobj is not s:
                sys.stdin.readline()
                sel.unregister(sys.stdin)
                sender_done = True
                continue
            _, anc, _, _ = s.recvmsg(2048, socket.CMSG_SPACE(16))
            ts = next((struct.unpack("qq", data[:16]) for lvl, typ, data in anc
                       if lvl == socket.SOL_SOCKET and typ == _SO_TIMESTAMPNS), None)
            stamps.append(ts[0] * 1_000_000_000 + ts[1] if ts else time.time_ns())
    return estimate(stamps, skip)


def send(dst_ip: str, port: int, rate_bps: float, seconds: float, burst_pkts: int) -> dict[str, float | int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _bufs(s)
    s.connect((dst_ip, port))
    payload = bytearray(PAYLOAD)
    per_s = rate_bps / (FRAME_BYTES * 8)
    sent = 0
    for _ in range(burst_pkts):  # spend the shaper's burst allowance, leave a queue
        struct.pack_into("!I", payload, 0, sent)
        try:
            s.send(payload)
        except OSError:
            break
        sent += 1
    t0 = time.perf_counter()
    first = sent
    while True:
        now = time.perf_counter() - t0
        if now >= seconds:
            break
        due = first + int(now * per_s) + 1
        while sent < due:
            struct.pack_into("!I", payload, 0, sent)
            try:
                s.send(payload)
            except (BlockingIOError, OSError):
                break
            sent += 1
        time.sleep(0.0002)
    took = time.perf_counter() - t0
    return {"sent": sent, "burst": first, "seconds": took,
            "send_rate_bps": (sent - first) * FRAME_BYTES * 8 / took if took else 0.0}


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "recv":
        print(json.dumps(recv(argv[1], int(argv[2]), float(argv[3]), int(argv[4]))), flush=True)
        return 0
    if len(argv) == 6 and argv[0] == "send":
        print(json.dumps(send(argv[1], int(argv[2]), float(argv[3]), float(argv[4]), int(argv[5]))), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
