"""UDP with sequence numbers, for order and loss checks through the impaired path.

``recv PORT IDLE_S``: prints ``ready``, then, at the ``end`` marker or after
``IDLE_S`` without a datagram once the caller closed its stdin (the sender is
done: a sender descheduled mid-stream on a loaded machine is not the stream's
end), one line: the received sequence numbers as JSON.
``send HOST PORT COUNT GAP_S``: COUNT datagrams numbered 0..COUNT-1, GAP_S apart,
then ``end`` markers.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time


def recv(port: int, idle_s: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("0.0.0.0", port))
    print("ready", flush=True)
    seqs: list[int] = []
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    sender_done = False
    while True:
        events = sel.select(timeout=idle_s if sender_done else None)
        if not events:
            break
        data = b""
        for key, _ in events:
            if key.fileobj is sys.stdin:
                sys.stdin.readline()  # a line or EOF: the sender is done
                sel.unregister(sys.stdin)
                sender_done = True
            else:
                data = sock.recv(2048)
                if data != b"end":
                    seqs.append(int(data.split(b" ", 1)[0]))
        if data == b"end":
            break
    print(json.dumps(seqs), flush=True)


def send(host: str, port: int, count: int, gap_s: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pad = b" " + b"x" * 100
    next_t = time.monotonic()
    for seq in range(count):
        sock.sendto(str(seq).encode() + pad, (host, port))
        next_t += gap_s
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    time.sleep(0.2)
    for _ in range(3):
        sock.sendto(b"end", (host, port))
        time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]), float(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
