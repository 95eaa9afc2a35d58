"""UDP probe for the netem tests: one-way delay, order and loss of a packet stream.

All network namespaces share one kernel clock, so a sender's ``time.time_ns()``
in the packet and the receiver's on arrival give the one-way delay.

    udp_probe.py recv BIND_IP PORT EXPECTED IDLE_S      -> prints one JSON line
    udp_probe.py send DST_IP PORT COUNT BURST GAP_S [SIZE]

The receiver prints ``READY`` once bound, then stops when EXPECTED packets
arrived, or when nothing arrived for IDLE_S seconds *after* the caller said
the sender is done (a line on the receiver's stdin, or its end).  The idle
clock starting only then matters: on a loaded machine, and far more under the
kernel lab's emulated CPU, a sender can be descheduled for longer than any
idle timeout mid-stream (a native test pauses one for 4 idle timeouts).
(CI's "92 of 4000" was first blamed on such a pause; it recurred with this
receiver, and its cause was the first hop's ARP: see ``resolve_path`` in
``test_netem.py``, which every stream now calls first.)
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time

HDR = struct.Struct("!IQ")  # sequence number, send time (ns)


def recv(bind_ip: str, port: int, expected: int, idle_s: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root): no drops in our own socket
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((bind_ip, port))
    print("READY", flush=True)
    seqs: list[int] = []
    owd_ns: list[int] = []
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    sender_done = False
    while len(seqs) < expected:
        events = sel.select(timeout=idle_s if sender_done else None)
        if not events:
            break  # the sender finished and nothing more came for IDLE_S
        for key, _ in events:
            if key.fileobj is sys.stdin:
                sys.stdin.readline()  # a line or EOF: either way the sender is done
                sel.unregister(sys.stdin)
                sender_done = True
                continue
            data = s.recv(65535)
            now = time.time_ns()
            seq, sent = HDR.unpack_from(data)
            seqs.append(seq)
            owd_ns.append(now - sent)
    out_of_order = 0
    highest = -1
    for q in seqs:
        if q < highest:
            out_of_order += 1
        highest = max(highest, q)
    return {"received": len(seqs), "unique": len(set(seqs)), "out_of_order": out_of_order, "seqs": seqs,
            "owd_ms": [round(x / 1e6, 4) for x in owd_ns]}


def send(dst_ip: str, port: int, count: int, burst: int, gap_s: float, size: int = 64) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pad = b"\0" * max(0, size - HDR.size)
    sent = 0
    for seq in range(count):
        while True:
            try:
                s.sendto(HDR.pack(seq, time.time_ns()) + pad, (dst_ip, port))
                break
            except (BlockingIOError, OSError):  # ENOBUFS on a full local queue: wait, never skip a number
                time.sleep(0.001)
        sent += 1
        if (seq + 1) % burst == 0 and gap_s > 0:
            time.sleep(gap_s)
    return {"sent": sent}


def main(argv: list[str]) -> int:
    if argv[0] == "recv":
        print(json.dumps(recv(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))), flush=True)
    elif argv[0] == "send":
        size = int(argv[6]) if len(argv) > 6 else 64
        print(json.dumps(send(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5]), size)), flush=True)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
