"""The collectives the schemes use (gloo), each with exact byte counts.

The testbed must say how many bytes each process sent to which DC, so
interface counters can be checked against it, and "ring" must really be a
ring in a chosen order (ordered by DC, so it crosses each inter-DC boundary
once per direction).  Every phase that can be a gloo collective is one:
gloo's point-to-point send/recv stalls in ~40 ms steps on shaped links (see
:func:`ring_allreduce`), and a baseline built on it would be slower than it
has to be (BLP's executor uses the same collectives for its DC phases).

* :func:`ring_allreduce` - reduce-scatter then all-gather over ``ring``
  (global ranks in ring order); every rank sends ``2 (n-1)/n * S`` bytes.
* :class:`HierarchicalAllReduce` - ``dist.reduce`` to each DC's leader on a
  per-DC group, ring all-reduce among the DC leaders, ``dist.broadcast`` in
  each DC (BSP ``allreduce: hierarchical`` and PGCS ``sync: hierarchical``).
* :class:`GroupBroadcast` - a leader's buffer to every member of its group
  (Gsyn's model broadcast): ``dist.broadcast`` on the group when it lies in
  one DC; a group spanning DCs sends one copy to one member in each other DC
  (a two-member group per DC, so exactly ``S`` crosses the WAN per DC and the
  DC it goes to is known), which broadcasts it inside its DC.

Byte counts inside a DC are what the algorithm must move (``S`` per member
for a reduce or broadcast); gloo may spread them differently over the LAN,
which never crosses a shaped link.  WAN bytes are exact.
``group`` is the torch.distributed (sub)group the ranks belong to; peers
are named by global rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from testbed.collect.recorder import Recorder
from testbed.training import dist as tdist
from testbed.training.jobs import Peer


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
    tmp = torch.empty(max(c.numel() for c in chunks), dtype=buf.dtype, device=buf.device)
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


class HierarchicalAllReduce:
    """Reduce in each DC, ring all-reduce among the DC leaders, broadcast in each DC.

    Construct on every worker in the same order (it creates process groups,
    a collective call).  The leader of a DC is its first rank.  Spans:
    ``intra_sync`` (``op: reduce`` / ``broadcast``) and, on leaders,
    ``wan_sync`` (``op: ring_allreduce``, ``wan_to`` the next leader's DC).
    """

    def __init__(self, peers: Sequence[Peer], rank: int, timeout_s: float) -> None:
        self.peers, self.rank = peers, rank
        self.dcs = tdist.ranks_by_dc(peers)
        self.leaders = [m[0] for m in self.dcs]
        self.dc_groups = tdist.make_subgroups(self.dcs, timeout_s)
        self.leader_group = tdist.make_subgroups([self.leaders], timeout_s)[0]
        self.my_dc = next(i for i, m in enumerate(self.dcs) if rank in m)

    def __call__(self, buf: torch.Tensor, rec: Recorder, step: int, **extra: Any) -> int:
        """Sum ``buf`` over every worker in place; returns the payload bytes this rank sent."""
        members = self.dcs[self.my_dc]
        leader, group = members[0], self.dc_groups[self.my_dc]
        size = buf.numel() * buf.element_size()
        total = 0
        if len(members) > 1:
            with rec.span("intra_sync", step=step, op="reduce", peer=self.peers[leader].host, **extra) as sp:
                dist.reduce(buf, dst=leader, group=group)
                sp["bytes"] = n = 0 if self.rank == leader else size
                total += n
        if self.rank == leader and len(self.leaders) > 1:
            with rec.span("wan_sync", step=step, op="ring_allreduce", peers=len(self.leaders), **extra) as sp:
                n = ring_allreduce(buf, self.leaders, self.leader_group)
                sp.set(bytes=n, **tdist.wan_fields(tdist.ring_wan_to(n, self.leaders, self.rank, self.peers)))
                total += n
        if len(members) > 1:
            with rec.span("intra_sync", step=step, op="broadcast", peer=self.peers[leader].host, **extra) as sp:
                dist.broadcast(buf, src=leader, group=group)
                sp["bytes"] = n = size * (len(members) - 1) if self.rank == leader else 0
                total += n
        return total


class GroupBroadcast:
    """The leader's buffer to every member of its group, for each of several groups (Gsyn).

    Construct on every worker with the same ``groups`` (lists of global
    ranks, leader first) in the same order: it creates the process groups.
    For a group inside one DC this is ``dist.broadcast`` on the group; for a
    group spanning DCs the leader sends one copy to the first member of each
    other DC (one two-member group each, sent concurrently), which then
    broadcasts inside its DC.  So the WAN carries exactly ``S`` per other DC,
    to a known DC.
    """

    def __init__(self, peers: Sequence[Peer], groups: Sequence[Sequence[int]], timeout_s: float) -> None:
        self.peers = peers
        self.plans: list[dict[str, Any]] = []
        t = timedelta(seconds=timeout_s)
        for members in groups:
            leader = members[0]
            by_dc: dict[str, list[int]] = {}
            for m in [leader] + sorted(m for m in members if m != leader):
                by_dc.setdefault(peers[m].dc, []).append(m)
            pairs = {dc: self._group([leader, ms[0]], t) for dc, ms in by_dc.items() if dc != peers[leader].dc}
            local = {dc: (ms[0], self._group(ms, t)) for dc, ms in by_dc.items() if len(ms) > 1}
            self.plans.append({"leader": leader, "by_dc": by_dc, "pairs": pairs, "local": local})

    @staticmethod
    def _group(ranks: Sequence[int], timeout: timedelta) -> Any:
        return dist.new_group(sorted(ranks), timeout=timeout) if len(ranks) > 1 else None

    def __call__(self, buf: torch.Tensor, g: int, rank: int) -> tuple[int, dict[str, int]]:
        """Broadcast group ``g``'s leader's ``buf`` in place; returns (bytes this rank sent, WAN bytes by DC)."""
        plan = self.plans[g]
        leader, dc = plan["leader"], self.peers[rank].dc
        size = buf.numel() * buf.element_size()
        sent, wan_to = 0, {}
        if rank == leader:
            works = [dist.broadcast(buf, src=leader, group=pg, async_op=True) for pg in plan["pairs"].values()]
            for w in works:
                w.wait()
            wan_to = dict.fromkeys(plan["pairs"], size)
            sent += size * len(works)
        elif dc != self.peers[leader].dc and plan["by_dc"][dc][0] == rank:
            dist.broadcast(buf, src=leader, group=plan["pairs"][dc])
        if dc in plan["local"]:
            src, pg = plan["local"][dc]
            dist.broadcast(buf, src=src, group=pg)
            if rank == src:
                sent += size * (len(plan["by_dc"][dc]) - 1)
        return sent, wan_to
