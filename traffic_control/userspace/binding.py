"""The same queue interface over the ``netfilterqueue`` binding (libnetfilter_queue).

Kept as the measured alternative to :mod:`.nfq`: the benchmark runs both
through the same daemon loop so the only difference is the mechanism.  The
binding cannot set ``NFQA_CFG_F_GSO`` (the kernel then segments GSO packets
before queueing them) and sends one verdict per packet with one syscall each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class BindingQueue:
    """NFQUEUE through ``netfilterqueue.NetfilterQueue`` with metadata-only copies."""

    mechanism = "binding"

    def __init__(self, queue: int, *, maxlen: int, **_ignored: Any) -> None:
        from netfilterqueue import COPY_META, NetfilterQueue  # optional dependency

        self.queue = queue
        self._nfq = NetfilterQueue()
        self._held: dict[int, Any] = {}
        self._new: list[int] = []
        self.stats = {"recv_msgs": 0, "sends": 0, "verdict_msgs": 0, "batch_verdicts": 0, "errors": 0}
        self._nfq.bind(queue, self._on_packet, max_len=maxlen, mode=COPY_META, range=0)
        self.gso = False
        self.batch = False

    def _on_packet(self, pkt: Any) -> None:
        pkt_id = pkt.id
        self._held[pkt_id] = pkt
        self._new.append(pkt_id)

    def fileno(self) -> int:
        return self._nfq.get_fd()

    def set_maxlen(self, maxlen: int, rcvbuf: int | None = None) -> None:
        """The binding sets the length only at bind time; a change applies on restart."""

    def receive(self, max_msgs: int, out: list[int]) -> int:
        # run(block=False) drains the socket; max_msgs cannot be honoured.
        self._nfq.run(block=False)
        got = len(self._new)
        out.extend(self._new)
        self._new.clear()
        self.stats["recv_msgs"] += got
        return got

    def drop(self, ids: Iterable[int]) -> None:
        held = self._held
        for pkt_id in ids:
            held.pop(pkt_id).drop()
            self.stats["verdict_msgs"] += 1
            self.stats["sends"] += 1

    def accept(self, ids: list[int], batchable: bool) -> None:
        held = self._held
        for pkt_id in ids:
            held.pop(pkt_id).accept()
        self.stats["verdict_msgs"] += len(ids)
        self.stats["sends"] += len(ids)

    def flush(self) -> None:
        """Verdicts went out one by one already."""

    def close(self) -> None:
        self._held.clear()
        self._nfq.unbind()
