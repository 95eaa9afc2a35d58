"""NFQUEUE over a raw ``NETLINK_NETFILTER`` socket: ids in, verdicts out, nothing else.

Why not libnetfilter_queue: the userspace side here only ever needs a
packet's id, never its bytes.  Speaking the protocol directly lets us

* ask for metadata only (``NFQNL_COPY_META``): no payload crosses to userspace;
* set ``NFQA_CFG_F_GSO``: GSO super-packets are queued whole instead of being
  segmented by the kernel first (up to ~45x fewer messages for bulk TCP);
* send verdicts in batches: ``NFQNL_MSG_VERDICT_BATCH`` accepts every held id
  up to N in one message, and per-packet verdicts for one loop turn go out
  together in one ``send``.

The ``netfilterqueue`` binding offers none of the last two; the benchmark
(``benchmarks/userspace_bench.py``) measures both side by side.

Wire format (``linux/netfilter/nfnetlink_queue.h``): ``nlmsghdr`` (host
order), ``nfgenmsg`` (``res_id`` = queue number, big endian), then attributes
whose payloads are big endian.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterable

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32

NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = NFNL_SUBSYS_QUEUE << 8 | 0
NFQNL_MSG_VERDICT = NFNL_SUBSYS_QUEUE << 8 | 1
NFQNL_MSG_CONFIG = NFNL_SUBSYS_QUEUE << 8 | 2
NFQNL_MSG_VERDICT_BATCH = NFNL_SUBSYS_QUEUE << 8 | 3

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NLA_TYPE_MASK = 0x3FFF

NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 0x4

NF_DROP = 0
NF_ACCEPT = 1

_NLMSGHDR = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")  # res_id is packed already in network order
_NLA = struct.Struct("=HH")
_BE32 = struct.Struct(">I")
_VERDICT = struct.Struct(">II")
_ERRNO = struct.Struct("=i")
_MSG_HEAD = _NLMSGHDR.size + _NFGEN.size
#: Verdict messages per ``send``: 32 bytes each, well under the socket's sndbuf.
_SEND_CHUNK = 2048


def _attr(kind: int, payload: bytes) -> bytes:
    pad = -len(payload) % 4
    return _NLA.pack(_NLA.size + len(payload), kind) + payload + b"\0" * pad


def _message(msg_type: int, flags: int, seq: int, queue: int, attrs: bytes, family: int = 0) -> bytes:
    body = _NFGEN.pack(family, 0, socket.htons(queue)) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


def config_message(queue: int, seq: int, *, cmd: int | None = None, copy_meta: bool = False,
                   maxlen: int | None = None, flags: int | None = None, flags_mask: int = 0,
                   ack: bool = True) -> bytes:
    """One ``NFQNL_MSG_CONFIG`` request (bind/unbind, copy mode, queue length, flags)."""
    attrs = b""
    if cmd is not None:
        attrs += _attr(NFQA_CFG_CMD, struct.pack(">BxH", cmd, 0))
    if copy_meta:
        attrs += _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
    if maxlen is not None:
        attrs += _attr(NFQA_CFG_QUEUE_MAXLEN, _BE32.pack(maxlen))
    if flags is not None:
        attrs += _attr(NFQA_CFG_FLAGS, _BE32.pack(flags)) + _attr(NFQA_CFG_MASK, _BE32.pack(flags_mask))
    return _message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | (NLM_F_ACK if ack else 0), seq, queue, attrs)


def verdict_prefix(queue: int, batch: bool) -> bytes:
    """The constant first 24 bytes of a verdict message for ``queue``; 8 bytes follow."""
    msg_type = NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT
    head = _NLMSGHDR.pack(_MSG_HEAD + _NLA.size + _VERDICT.size, msg_type, NLM_F_REQUEST, 0, 0)
    return head + _NFGEN.pack(0, 0, socket.htons(queue)) + _NLA.pack(_NLA.size + _VERDICT.size, NFQA_VERDICT_HDR)


def parse(buf: bytes | bytearray | memoryview, size: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Split a received datagram into packet ids and ``(seq, errno)`` of error/ack messages."""
    ids: list[int] = []
    errors: list[tuple[int, int]] = []
    off = 0
    while off + _NLMSGHDR.size <= size:
        length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(buf, off)
        if length < _NLMSGHDR.size or off + length > size:
            break
        if msg_type == NFQNL_MSG_PACKET:
            pkt_id = _packet_id(buf, off + _MSG_HEAD, off + length)
            if pkt_id is not None:
                ids.append(pkt_id)
        elif msg_type == NLMSG_ERROR:
            errors.append((seq, -_ERRNO.unpack_from(buf, off + _NLMSGHDR.size)[0]))
        off += (length + 3) & ~3
    return ids, errors


def _packet_id(buf: bytes | bytearray | memoryview, off: int, end: int) -> int | None:
    # The kernel puts NFQA_PACKET_HDR first; walk only if it ever does not.
    while off + _NLA.size <= end:
        alen, atype = _NLA.unpack_from(buf, off)
        if alen < _NLA.size:
            return None
        if atype & NLA_TYPE_MASK == NFQA_PACKET_HDR:
            return _BE32.unpack_from(buf, off + _NLA.size)[0]
        off += (alen + 3) & ~3
    return None


class QueueBusy(OSError):
    """Another process holds this queue number in this network namespace."""


class NetlinkQueue:
    """One bound NFQUEUE: non-blocking receive of ids, buffered verdicts.

    Verdicts are buffered until :meth:`flush` so that one loop turn costs one
    ``send``; drops are queued before accepts, which matters because a batch
    accept covers every lower id still held by the kernel.
    """

    mechanism = "netlink"

    def __init__(self, queue: int, *, maxlen: int, gso: bool = True, batch: bool = True,
                 rcvbuf: int = 4 << 20) -> None:
        if not 0 <= queue <= 0xFFFF:
            raise ValueError(f"queue number must be 0..65535, got {queue}")
        self.queue = queue
        self.gso = gso
        self.batch = batch
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        self._seq = 0
        self._buf = bytearray(65536)
        self._view = memoryview(self._buf)
        self._out: list[bytes] = []
        self._single = verdict_prefix(queue, batch=False)
        self._batch = verdict_prefix(queue, batch=True)
        self.pending: list[int] = []
        self.stats = {"recv_msgs": 0, "sends": 0, "verdict_msgs": 0, "batch_verdicts": 0, "errors": 0}
        try:
            self._sock.bind((0, 0))
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
            self._sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 1 << 20)
            # A full receive buffer drops the packet in the kernel (counted as
            # user_dropped); we want that accounted, not an ENOBUFS error.
            self._sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
            self._request(config_message(queue, self._next_seq(), cmd=NFQNL_CFG_CMD_BIND))
            self._request(config_message(queue, self._next_seq(), copy_meta=True, maxlen=maxlen))
            if gso:
                self._request(config_message(queue, self._next_seq(), flags=NFQA_CFG_F_GSO,
                                             flags_mask=NFQA_CFG_F_GSO))
        except BaseException:
            self._sock.close()
            raise
        self._sock.setblocking(False)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _request(self, msg: bytes) -> None:
        """Send a config request and wait for its ack; ids that arrive meanwhile go to ``pending``."""
        seq = _NLMSGHDR.unpack_from(msg)[3]
        self._sock.settimeout(2.0)
        try:
            self._sock.send(msg)
            while True:
                size = self._sock.recv_into(self._buf)
                ids, errors = parse(self._view, size)
                self.pending.extend(ids)
                for got_seq, err in errors:
                    if got_seq != seq:
                        continue
                    if err in (errno.EPERM, errno.EBUSY):
                        # the kernel answers EPERM when another socket owns the queue
                        raise QueueBusy(err, f"NFQUEUE {self.queue} is bound by another process "
                                             "(or this process lacks CAP_NET_ADMIN)")
                    if err:
                        raise OSError(err, f"NFQUEUE {self.queue} config: {os.strerror(err)}")
                    return
        finally:
            self._sock.settimeout(None)

    def set_maxlen(self, maxlen: int, rcvbuf: int | None = None) -> None:
        """Change the kernel queue bound on the fly (no ack awaited; errors are counted)."""
        if rcvbuf:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        self._out.append(config_message(self.queue, self._next_seq(), maxlen=maxlen, ack=False))

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self, max_msgs: int, out: list[int]) -> int:
        """Append up to ``max_msgs`` queued packet ids to ``out`` without blocking."""
        if self.pending:
            out.extend(self.pending)
            self.pending.clear()
        recv_into, buf, view = self._sock.recv_into, self._buf, self._view
        got = 0
        while got < max_msgs:
            try:
                size = recv_into(buf)
            except BlockingIOError:
                break
            got += 1
            # Fast path: one packet message, NFQA_PACKET_HDR first.
            if size >= 28 and buf[4] == 0 and buf[5] == NFNL_SUBSYS_QUEUE and buf[22] == NFQA_PACKET_HDR:
                out.append(_BE32.unpack_from(buf, 24)[0])
                continue
            ids, errors = parse(view, size)
            out.extend(ids)
            self.stats["errors"] += sum(1 for _, err in errors if err)
        self.stats["recv_msgs"] += got
        return got

    def drop(self, ids: Iterable[int]) -> None:
        pack, prefix = _VERDICT.pack, self._single
        self._out.extend(prefix + pack(NF_DROP, i) for i in ids)

    def accept(self, ids: list[int], batchable: bool) -> None:
        """Accept ``ids``; with ``batchable`` (a prefix of held ids in order) one message does it."""
        if not ids:
            return
        if batchable and self.batch:
            self._out.append(self._batch + _VERDICT.pack(NF_ACCEPT, ids[-1]))
            self.stats["batch_verdicts"] += 1
        else:
            pack, prefix = _VERDICT.pack, self._single
            self._out.extend(prefix + pack(NF_ACCEPT, i) for i in ids)

    def flush(self) -> None:
        """Send every buffered verdict, in order, in as few ``send`` calls as possible."""
        out = self._out
        if not out:
            return
        self.stats["verdict_msgs"] += len(out)
        for start in range(0, len(out), _SEND_CHUNK):
            chunk = b"".join(out[start:start + _SEND_CHUNK])
            while True:
                try:
                    self._sock.send(chunk)
                    break
                except BlockingIOError:
                    # Kernel-side processing of verdicts is synchronous; this
                    # only happens under memory pressure.  Retry, never lose one.
                    continue
            self.stats["sends"] += 1
        out.clear()

    def close(self) -> None:
        """Unbind by closing: the kernel drops whatever is still held (fail closed)."""
        self._sock.close()
