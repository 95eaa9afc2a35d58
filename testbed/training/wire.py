"""Framed messages over TCP for the parameter server (no torch needed).

Frame: ``b"TBPS"``, header length (uint32), payload length (uint64), a
JSON header, then the raw payload (float32 little-endian parameters or
gradients).  Why our own framing rather than torch.distributed
point-to-point for the server:

* the server is a separate process that must accept pushes from any client
  in any order, hold some replies (SSP) and answer others at once; gloo's
  point-to-point needs the server inside the workers' process group, a
  matching ``recv`` per ``send`` and gives no per-message metadata;
* each message carries its own header (client, sequence number, step,
  model version, flags), which is what makes "apply every pushed update
  exactly once" checkable: the server keeps each client's last applied
  sequence number and answers a re-sent push without applying it again;
* it is plain TCP on the host's own address (the server binds the
  address from its job; clients connect to it), so the bytes cross the
  emulated interface and the byte counts we record are exact (payload plus
  a header of a few hundred bytes).

``TCP_NODELAY`` is set: a header and its payload go out in one
``sendmsg`` anyway, and small replies must not wait for Nagle.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

MAGIC = b"TBPS"
_PREFIX = struct.Struct("<4sIQ")


class ProtocolError(ConnectionError):
    """The peer sent something that is not a frame of this protocol."""


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _sendall_vec(sock: socket.socket, bufs: list[memoryview]) -> None:
    bufs = [b for b in bufs if b.nbytes]
    while bufs:
        sent = sock.sendmsg(bufs)
        while bufs and sent >= bufs[0].nbytes:
            sent -= bufs[0].nbytes
            bufs.pop(0)
        if sent:
            bufs[0] = bufs[0][sent:]


def send_msg(sock: socket.socket, header: dict[str, Any], payload: memoryview | bytes | None = None) -> int:
    """Send one frame; returns the bytes written (prefix + header + payload)."""
    pay = memoryview(payload).cast("B") if payload is not None else memoryview(b"")
    head = json.dumps(header, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, len(head), pay.nbytes)
    _sendall_vec(sock, [memoryview(prefix), memoryview(head), pay])
    return len(prefix) + len(head) + pay.nbytes


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < view.nbytes:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("peer closed the connection")
        got += k


def recv_msg(sock: socket.socket, into: bytearray | None = None) -> tuple[dict[str, Any], memoryview, int]:
    """Receive one frame: (header, payload view, total bytes read).

    The payload lands in ``into`` when it is large enough (reused between
    messages to avoid allocating a model-sized buffer per message).
    """
    pre = bytearray(_PREFIX.size)
    _recv_exact(sock, memoryview(pre))
    magic, hlen, plen = _PREFIX.unpack(pre)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r}")
    head = bytearray(hlen)
    _recv_exact(sock, memoryview(head))
    buf = into if into is not None and len(into) >= plen else bytearray(plen)
    view = memoryview(buf)[:plen]
    _recv_exact(sock, view)
    return json.loads(head), view, _PREFIX.size + hlen + plen
