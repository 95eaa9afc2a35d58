"""A one-way delay probe: a UDP train whose every datagram carries its send time (stdlib only).

Run inside a node (``python -I -S owd_train.py ...``, ~20 ms to start)::

    owd_train.py recv BIND_IP PORT WAIT_S        prints "ready", then one JSON line
    owd_train.py send DST_IP PORT COUNT SPACING_S prints one JSON line

The receiver ends 0.5 s after the last datagram once its stdin says the
sender is done (a line, or EOF: :func:`.measure.receiver_then_sender` closes
it when the sender exits), or after WAIT_S in all.

Every emulated node of a run shares this machine's kernel clock, so the
receiver's kernel arrival stamp (``SO_TIMESTAMPNS``, ``CLOCK_REALTIME``)
minus the send time the sender wrote into the datagram (``CLOCK_REALTIME``,
read just before ``sendto``) is the one-way delay of that datagram,
with no clock offset to estimate.  Small datagrams (64 bytes of payload),
paced ``SPACING_S`` apart: dense enough to be bulk traffic for the jitter
process (README "Jitter, defined"), light enough (a few Mbit/s) to queue
nowhere.  The receiver reports the delays' mean, standard deviation (of
the central 99 %, ``sd_s``; all of them, ``sd_all_s``), percentiles, how many
arrived, how many were duplicates, and how many arrived after a datagram
sent later than them (``reordered``).
"""

from __future__ import annotations

import json
import math
import selectors
import socket
import struct
import sys
import time

HEADER = struct.Struct("!IQ")  # sequence number, send time (ns, CLOCK_REALTIME)
PAYLOAD = 64
IDLE_END_S = 0.5
#: Share of the delays left out at each end for ``sd_s`` (``sd_all_s`` keeps them).
TRIM = 0.005
_SO_TIMESTAMPNS = 35


def summarize(delays_ns: list[int], seqs: list[int]) -> dict[str, float | int | None]:
    """Statistics of one-way delays (ns in, seconds out) and of arrival order."""
    n = len(delays_ns)
    out: dict[str, float | int | None] = {"received": n, "unique": len(set(seqs)),
                                          "duplicates": n - len(set(seqs))}
    highest = -1
    reordered = 0
    for s in seqs:
        if s < highest:
            reordered += 1
        highest = max(highest, s)
    out["reordered"] = reordered
    if not n:
        out.update(mean_s=None, sd_s=None, min_s=None, p50_s=None, p99_s=None, max_s=None)
        return out
    d = sorted(x / 1e9 for x in delays_ns)
    mean = sum(d) / n

    def sd(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0

    def pct(p: float) -> float:
        return d[min(n - 1, max(0, math.ceil(p * n) - 1))]

    # sd of the central 99 %: a datagram whose sender was descheduled between stamping and sending
    # (a loaded machine) reads milliseconds late; that is the probe, not the link
    cut = int(n * TRIM)
    central = d[cut:n - cut] if n - 2 * cut > 1 else d
    out.update(mean_s=mean, sd_s=sd(central), sd_all_s=sd(d), min_s=d[0], p50_s=pct(0.5), p99_s=pct(0.99),
               max_s=d[-1])
    return out


def sender_done_watch() -> tuple[selectors.BaseSelector, bool]:
    """A selector on stdin, through which the caller says the sender is done (a line, or EOF).

    Whether the sender is already done: ``True`` when stdin cannot say it (``/dev/null``, a file,
    none), where the receiver falls back to an idle gap counted from the first datagram.
    """
    sel = selectors.DefaultSelector()
    try:
        sel.register(sys.stdin, selectors.EVENT_READ)
    except (AttributeError, ValueError, OSError):  # no stdin, or one epoll cannot watch
        return sel, True
    return sel, False


def recv(bind_ip: str, port: int, wait_s: float) -> dict[str, float | int | None]:
    """Receive until the train has ended: :data:`IDLE_END_S` without a datagram *after* the caller
    said the sender is done (closed this process's stdin), or ``wait_s`` in all if it never does.

    The idle clock must not run while the sender still sends: on a loaded machine, and far more
    under the kernel lab's emulated CPU, a sender can be descheduled mid-train for longer than any
    idle gap, and a receiver that took the pause for the train's end counted the rest as lost.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((bind_ip, port))
    sel, sender_done = sender_done_watch()
    sel.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    delays: list[int] = []
    seqs: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if not sender_done and left <= 0:
            break  # the caller never said: bounded by wait_s, as before the first datagram
        # once the sender is done, the train's end is an idle gap (the whole wait while none came yet)
        timeout = (IDLE_END_S if delays else max(IDLE_END_S, left)) if sender_done else left
        events = sel.select(timeout)
        if not events:
            break
        for key, _ in events:
            if key.fileobj is not s:
                sys.stdin.readline()
                sel.unregister(sys.stdin)
                sender_done = True
                continue
            data, anc, _flags, _addr = s.recvmsg(256, 64)
            arrived = None
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", raw[:16])
                    arrived = sec * 1_000_000_000 + nsec
            if arrived is None or len(data) < HEADER.size:
                continue
            seq, sent = HEADER.unpack_from(data)
            delays.append(arrived - sent)
            seqs.append(seq)
    return summarize(delays, seqs)


def send(dst_ip: str, port: int, count: int, spacing_s: float) -> dict[str, float | int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    pad = b"\0" * (PAYLOAD - HEADER.size)
    t0 = time.monotonic()
    for i in range(count):
        due = t0 + i * spacing_s
        while True:
            left = due - time.monotonic()
            if left <= 0:
                break
            if left > 0.0005:
                time.sleep(left - 0.0003)
        s.sendto(HEADER.pack(i, time.time_ns()) + pad, (dst_ip, port))
    return {"sent": count, "seconds": time.monotonic() - t0}


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "recv":
        print(json.dumps(recv(argv[1], int(argv[2]), float(argv[3]))), flush=True)
        return 0
    if len(argv) >= 5 and argv[0] == "send":
        print(json.dumps(send(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
