"""Collectives built from torch.distributed point-to-point (gloo), with exact byte counts.

Why not ``dist.all_reduce``: the testbed must say how many bytes each
process sent to whom, so interface counters can be checked against it, and
"ring" must really be a ring in a chosen order (ordered by DC, so it
crosses each inter-DC boundary once per direction).  Each function returns
the payload bytes *this* process sent.

* :func:`ring_allreduce` - reduce-scatter then all-gather over ``ring``
  (global ranks in ring order); every rank sends ``2 (n-1)/n * S`` bytes.
  Each chunk's final sum is computed once and copied, so all ranks end
  with bit-identical buffers.
* :func:`star_reduce` - members send their buffer to the leader, which sums
  in member order (deterministic); ``S`` bytes per member.
* :func:`star_broadcast` - the leader sends its buffer to each member.

``group`` is the torch.distributed (sub)group the ranks belong to; peers
are named by global rank.  Chunk sizes follow ``tensor_split``, known to
all ranks, so empty chunks are skipped on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _wait(*works: object) -> None:
    for w in works:
        if w is not None:
            w.wait()  # type: ignore[attr-defined]


def ring_allreduce(buf: torch.Tensor, ring: Sequence[int], group: object | None = None) -> int:
    """In-place sum of ``buf`` (1-D, contiguous, CPU) over the ranks of ``ring``.

    When the ring is in rank order (the usual case: ranks are numbered DC by
    DC, so that ring crosses each DC boundary once per direction) this is
    gloo's own ring all-reduce on ``group``, which sends exactly the ring's
    ``2 (n-1)/n * S`` per rank to the next rank.  Measured on the emulated
    network (benchmarks/ring_allreduce.py --impl p2p): the point-to-point
    version below stalls in steps of ~40 ms (a delayed-ACK interaction of
    gloo's send/recv handshakes: 1 MiB over 100 Mbit/s took 0.098 or 0.172 s,
    against a steady 0.096 s for gloo's ring).  Other orders use the
    point-to-point ring.
    """
    n = len(ring)
    if n <= 1:
        return 0
    if list(ring) == sorted(ring):
        dist.all_reduce(buf, group=group)
        return _ring_bytes(buf, n)
    return _p2p_ring_allreduce(buf, ring, group)


def _ring_bytes(buf: torch.Tensor, n: int) -> int:
    """Payload one rank sends in a ring all-reduce of ``buf`` over ``n`` ranks: 2 (n-1)/n * S."""
    return int(round(2 * (n - 1) / n * buf.numel())) * buf.element_size()


def _p2p_ring_allreduce(buf: torch.Tensor, ring: Sequence[int], group: object | None = None) -> int:
    """The ring with torch.distributed point-to-point, for rings not in rank order."""
    n = len(ring)
    me = ring.index(dist.get_rank())
    right, left = ring[(me + 1) % n], ring[(me - 1) % n]
    chunks = list(buf.tensor_split(n))
    tmp = torch.empty(max(c.numel() for c in chunks), dtype=buf.dtype)
    sent = 0
    for i in range(n - 1):  # reduce-scatter: after it, rank `me` owns the full sum of chunk me+1
        s, r = chunks[(me - i) % n], chunks[(me - i - 1) % n]
        rt = tmp[: r.numel()]
        ws = dist.isend(s, right, group=group) if s.numel() else None
        wr = dist.irecv(rt, left, group=group) if r.numel() else None
        _wait(ws, wr)
        r.add_(rt)
        sent += s.numel() * s.element_size()
    for i in range(n - 1):  # all-gather: pass the finished chunks around
        s, r = chunks[(me + 1 - i) % n], chunks[(me - i) % n]
        ws = dist.isend(s, right, group=group) if s.numel() else None
        wr = dist.irecv(r, left, group=group) if r.numel() else None
        _wait(ws, wr)
        sent += s.numel() * s.element_size()
    return sent


class StarReducer:
    """Sum into the leader; keeps the leader's receive buffers between steps."""

    def __init__(self) -> None:
        self._bufs: list[torch.Tensor] = []

    def __call__(self, buf: torch.Tensor, leader: int, members: Sequence[int], group: object | None = None) -> int:
        others = [m for m in members if m != leader]
        if not others:
            return 0
        me = dist.get_rank()
        if me != leader:
            dist.send(buf, leader, group=group)
            return buf.numel() * buf.element_size()
        while len(self._bufs) < len(others):
            self._bufs.append(torch.empty_like(buf))
        works = [dist.irecv(self._bufs[i][: buf.numel()], m, group=group) for i, m in enumerate(others)]
        for i, w in enumerate(works):  # sum in member order: deterministic
            w.wait()
            buf.add_(self._bufs[i][: buf.numel()])
        return 0


def star_broadcast(buf: torch.Tensor, leader: int, members: Sequence[int], group: object | None = None) -> int:
    """Copy the leader's ``buf`` to every member."""
    others = [m for m in members if m != leader]
    if not others:
        return 0
    if dist.get_rank() == leader:
        works = [dist.isend(buf, m, group=group) for m in others]
        _wait(*works)
        return buf.numel() * buf.element_size() * len(others)
    dist.recv(buf, leader, group=group)
    return 0
