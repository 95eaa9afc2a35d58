"""Run a BLP plan with torch.distributed point-to-point operations (gloo).

:class:`BlpAllReduce` performs exactly the plan of :mod:`.solver`:

1. intra-DC reduce: every rank of a DC sends its tensor to the DC leader,
   which sums (point-to-point, or ``dist.reduce`` on a per-DC group when
   ``group_of_dc`` is given);
2. for every tree, concurrently: the tree's slice of the flat tensor (its
   share, in tree order) is cut into the plan's chunks; chunk ``i`` is reduced
   towards the root (a leader waits for chunk ``i`` from each child, adds it to
   its own, sends the partial sum to its parent) and the root's total is
   broadcast back down the same tree; chunks are pipelined: chunk ``i+1``
   climbs while chunk ``i`` descends.  A tree rooted at a link (``pair``)
   reduces towards both ends of the link, which exchange their sides'
   partial sums and add them (the same IEEE sum at both ends), then broadcast;
3. intra-DC broadcast from the leader.

The result is the **sum** over all participating ranks (``average=True``
divides by their number), written in place.  Every call returns the payload
bytes this rank sent to each peer rank by point-to-point (intra-DC phases
included unless they ran as collectives on ``group_of_dc``), so the byte
accounting can be checked against interface counters.

Why threads: one thread per tree and direction waits for the chunks it needs
and forwards them, so a slow branch never blocks another tree or the other
direction, and no global send/receive order has to be agreed (waits only ever
depend on other DCs' earlier steps, so there is no deadlock).  Each thread
keeps a window of chunks in flight: receives posted ahead, sends not yet
completed, so the number of pending gloo operations stays bounded (with
thousands pending, each message cost measurably more on loopback).
Partial sums are accumulated in place and the broadcast of chunk ``i`` is
received into the same memory, which is safe because that data cannot arrive
before this rank has sent its own contribution to chunk ``i``.  Every gloo
work is waited exactly once (a second wait on a receive blocks for another
message).

Why windows of posted receives: gloo's point-to-point send/recv waits for
the receiver's "ready" notice before data flows, and one message at a time
stalls in ~40 ms steps on shaped links (delayed ACKs; measured with
``benchmarks/ring_allreduce.py --impl p2p``, see
``testbed/training/collectives.py``).  With many chunks in flight and the
receives posted ahead, the notices are answered long before the data is
needed and the link streams; phases that can be collectives (intra-DC
reduce/broadcast with ``group_of_dc``) are collectives.

The baselines that are not trees run beside it with the same intra-DC phases
(:class:`_LeaderScheme`):

* :class:`RingRelayAllReduce`: ring all-reduce (reduce-scatter + all-gather)
  among DC leaders in a given DC order, chunked and pipelined like the trees
  (windows of posted receives), every hop forwarded along its route by the
  leaders of the DCs in between (``ring_relay`` of :mod:`.baselines`).
* :class:`HierarchicalAllReduce`: ``dist.reduce`` on the DC's group,
  ``dist.all_reduce`` (gloo's ring) on the leaders' group, ``dist.broadcast``
  on the DC's group: collectives only.

Tree-shaped baselines (``tree_best``, ``blink``, ``star``) are plans and run
on :class:`BlpAllReduce` itself.

Tensors must be on the CPU for gloo (a CUDA tensor is copied to the CPU and
back).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from traffic_control.errors import ValidationError

from .model import Plan

_INTRA_UP, _INTRA_DOWN = 0, 1

#: Chunks in flight per tree and direction (see :class:`BlpAllReduce`).
DEFAULT_WINDOW = 64


def split_bounds(numel: int, plan: Plan) -> list[list[tuple[int, int]]]:
    """Element ranges of every tree's chunks: tree slices by cumulative share, chunks evenly.

    Deterministic from ``numel`` and the plan, so every rank cuts the same
    way; empty chunks (tensor smaller than the chunk count) are dropped.
    """
    total = sum(t.share for t in plan.trees)
    out = []
    cum = 0.0
    start = 0
    for k, t in enumerate(plan.trees):
        cum += t.share
        end = numel if k == len(plan.trees) - 1 else min(numel, round(cum / total * numel))
        length = end - start
        n = max(1, t.chunks)
        cuts = [start + (length * i) // n for i in range(n + 1)]
        out.append([(a, b) for a, b in zip(cuts, cuts[1:]) if b > a])
        start = end
    return out


def make_dc_groups(dc_of_rank: Mapping[int, str]) -> dict[str, Any]:
    """One process group per DC (``dist.new_group``); every rank of the world must call this."""
    groups = {}
    for dc in sorted(set(dc_of_rank.values())):
        ranks = sorted(r for r, d in dc_of_rank.items() if d == dc)
        groups[dc] = dist.new_group(ranks)
    return groups


def make_leader_group(leaders: Mapping[str, int]) -> Any:
    """The process group of the DC leaders (``dist.new_group``); every rank of the world must call this."""
    return dist.new_group(sorted(leaders.values()))


class _LeaderScheme:
    """What every leader-based scheme shares: rank/DC/leader checks and the intra-DC phases.

    Subclasses implement :meth:`_leaders` (the WAN phase among DC leaders,
    called on leaders only and only with more than one DC).
    """

    def __init__(self, dcs: Sequence[str], rank: int, dc_of_rank: Mapping[int, str],
                 leaders: Mapping[str, int] | None = None, group_of_dc: Mapping[str, Any] | None = None,
                 *, average: bool = False, tag_base: int = 0, window: int = DEFAULT_WINDOW,
                 field_name: str = "plan") -> None:
        self.dcs = tuple(dcs)
        self.rank = rank
        self.dc_of_rank = dict(dc_of_rank)
        if rank not in self.dc_of_rank:
            raise ValidationError("dc_of_rank", f"rank {rank} has no DC", "map every participating rank to its DC")
        unknown = sorted(set(self.dc_of_rank.values()) - set(self.dcs))
        if unknown:
            raise ValidationError("dc_of_rank", f"DCs {unknown} are not in the {field_name}",
                                  f"use DCs of {list(self.dcs)}")
        if leaders is None:
            leaders = {}
            for r in sorted(self.dc_of_rank):
                leaders.setdefault(self.dc_of_rank[r], r)
        self.leaders = dict(leaders)
        for dc in self.dcs:
            lead = self.leaders.get(dc)
            if lead is None or self.dc_of_rank.get(lead) != dc:
                raise ValidationError(f"leaders.{dc}", f"DC {dc!r} has no leader rank in it (got {lead!r})",
                                      f"give each DC of the {field_name} one of its own ranks as leader")
        self.group_of_dc = dict(group_of_dc) if group_of_dc else None
        self.average = average
        self.tag_base = tag_base
        if window < 1:
            raise ValidationError("window", f"window must be >= 1, got {window}", f"use e.g. {DEFAULT_WINDOW}")
        self.window = window
        self.dc = self.dc_of_rank[rank]
        self.members = sorted(r for r, d in self.dc_of_rank.items() if d == self.dc)
        self.is_leader = self.leaders[self.dc] == rank
        self.world = len(self.dc_of_rank)
        #: Seconds this rank spent in each phase of its last call (intra-DC reduce, WAN phase, intra-DC broadcast).
        self.last_phases: dict[str, float] = {}

    # ------------------------------------------------------------ public
    def __call__(self, tensor: torch.Tensor) -> dict[int, int]:
        """Reduce ``tensor`` (any shape, contiguous) in place; returns bytes sent per peer rank."""
        if not tensor.is_contiguous():
            raise ValueError(f"{type(self).__name__} needs a contiguous tensor (flatten the gradients into one buffer)")
        if tensor.is_cuda:
            host = tensor.detach().cpu()
            sent = self._run(host.view(-1))
            tensor.copy_(host)
            return sent
        return self._run(tensor.detach().view(-1))

    # ------------------------------------------------------------ phases
    def _run(self, flat: torch.Tensor) -> dict[int, int]:
        sent: dict[int, int] = {}
        t0 = time.monotonic()
        self._intra_reduce(flat, sent)
        t1 = time.monotonic()
        if self.is_leader and len(self.dcs) > 1:
            self._leaders(flat, sent)
        t2 = time.monotonic()
        self._intra_broadcast(flat, sent)
        t3 = time.monotonic()
        if self.average:
            flat.div_(self.world)
        self.last_phases = {"intra_reduce": t1 - t0, "wan": t2 - t1, "intra_broadcast": t3 - t2}
        return sent

    def _leaders(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        raise NotImplementedError

    def _intra_reduce(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        if len(self.members) == 1:
            return
        leader = self.leaders[self.dc]
        if self.group_of_dc is not None:
            dist.reduce(flat, dst=leader, group=self.group_of_dc[self.dc])
            return
        if not self.is_leader:
            dist.isend(flat, leader, tag=self.tag_base + _INTRA_UP).wait()
            _count(sent, leader, flat)
            return
        bufs = []
        for r in self.members:
            if r != self.rank:
                buf = torch.empty_like(flat)
                bufs.append((buf, dist.irecv(buf, r, tag=self.tag_base + _INTRA_UP)))
        for buf, work in bufs:
            work.wait()
            flat.add_(buf)

    def _intra_broadcast(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        if len(self.members) == 1:
            return
        leader = self.leaders[self.dc]
        if self.group_of_dc is not None:
            dist.broadcast(flat, src=leader, group=self.group_of_dc[self.dc])
            return
        if not self.is_leader:
            dist.irecv(flat, leader, tag=self.tag_base + _INTRA_DOWN).wait()
            return
        works = []
        for r in self.members:
            if r != self.rank:
                works.append(dist.isend(flat, r, tag=self.tag_base + _INTRA_DOWN))
                _count(sent, r, flat)
        for w in works:
            w.wait()

    # ------------------------------------------------------------ p2p helpers
    def _irecv(self, buf: torch.Tensor, dc: str, tag: int) -> tuple[Any, torch.Tensor]:
        return dist.irecv(buf, self.leaders[dc], tag=tag), buf

    def _isend(self, buf: torch.Tensor, dc: str, tag: int, sent: dict[int, int]) -> tuple[Any, torch.Tensor]:
        peer = self.leaders[dc]
        work = dist.isend(buf, peer, tag=tag)
        _count(sent, peer, buf)
        return work, buf


class BlpAllReduce(_LeaderScheme):
    """All-reduce a flat tensor along ``plan``; see the module docstring.

    ``dc_of_rank``: every participating global rank -> its DC (names as in
    the plan).  ``leaders``: DC -> leader rank (default: the lowest rank of
    each DC).  ``group_of_dc``: optional per-DC process groups (from
    :func:`make_dc_groups`) for the intra-DC phases; without it they are
    point-to-point.  ``tag_base``: offset for the point-to-point tags, so
    that several instances can run at once on one process group.
    ``window``: chunks a tree direction keeps in flight (receives posted
    ahead, sends not yet completed); it must cover the bandwidth-delay
    product (64 x 256 KiB = 16 MiB covers 1 Gbit/s over a 130 ms round trip).
    """

    def __init__(self, plan: Plan, rank: int, dc_of_rank: Mapping[int, str],
                 leaders: Mapping[str, int] | None = None, group_of_dc: Mapping[str, Any] | None = None,
                 *, average: bool = False, tag_base: int = 0, window: int = DEFAULT_WINDOW) -> None:
        super().__init__(plan.dcs, rank, dc_of_rank, leaders, group_of_dc, average=average, tag_base=tag_base,
                         window=window)
        self.plan = plan
        self._children = [t.children() for t in plan.trees]
        self._stride = 2 * (max(t.chunks for t in plan.trees) + 1)

    # ------------------------------------------------------------ tags
    @property
    def tag_span(self) -> int:
        """Tags this instance uses: ``[tag_base, tag_base + tag_span)``; space concurrent instances that far apart."""
        return 2 + len(self.plan.trees) * self._stride

    def _tag(self, tree: int, chunk: int, down: bool) -> int:
        return self.tag_base + 2 + tree * self._stride + 2 * chunk + int(down)

    def _leaders(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        self._trees(flat, sent)

    def _trees(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        me = self.dc
        bounds = split_bounds(flat.numel(), self.plan)
        jobs: list[Callable[[], None]] = []
        for k, tree in enumerate(self.plan.trees):
            chunks = bounds[k]
            if not chunks:
                continue
            kids = self._children[k].get(me, [])
            parent = tree.parents.get(me)
            if tree.pair is not None and me in (tree.root, tree.pair):
                # a link root: each end is the top of its own side and exchanges with the other
                partner = tree.pair if me == tree.root else tree.root
                kids = [c for c in kids if c != tree.pair]
                ready = threading.Semaphore(0)
                jobs.append(_bind(self._up, flat, k, chunks, kids, None, (partner, ready), sent))
                jobs.append(_bind(self._down, flat, k, chunks, kids, partner, sent, ready))
                continue
            jobs.append(_bind(self._up, flat, k, chunks, kids, parent, None, sent))
            if parent is not None:
                jobs.append(_bind(self._down, flat, k, chunks, kids, parent, sent))
        _run_threads(jobs)

    def _up(self, flat: torch.Tensor, k: int, chunks: list[tuple[int, int]], kids: list[str],
            parent: str | None, link: tuple[str, threading.Semaphore] | None, sent: dict[int, int]) -> None:
        """Reduce direction of tree ``k`` at this leader.

        Chunk ``i``: add the children's partial sums into this rank's slice (in
        place: the final value later overwrites it) and send it to the parent;
        at the root the slice is then final and goes down to the children.  At
        an end of a link root (``link``: the other end and a semaphore), the
        side's partial sum goes to the other end as a copy (the slice is added
        to later) and the semaphore tells :meth:`_down` that chunk ``i``
        of this side is complete.
        """
        w = self.window
        recvs: dict[str, deque[tuple[Any, torch.Tensor]]] = {c: deque() for c in kids}

        def post(i: int) -> None:
            a, b = chunks[i]
            for c in kids:
                recvs[c].append(self._irecv(torch.empty(b - a, dtype=flat.dtype), c, self._tag(k, i, False)))

        for i in range(min(w, len(chunks))):
            post(i)
        sends: deque[tuple[Any, torch.Tensor]] = deque()
        for i, (a, b) in enumerate(chunks):
            acc = flat[a:b]
            for c in kids:
                work, buf = recvs[c].popleft()
                work.wait()
                acc.add_(buf)
            if i + w < len(chunks):
                post(i + w)
            if link is not None:
                partner, ready = link
                to_down = self.dc == self.plan.trees[k].root  # the root sends on the broadcast tag
                sends.append(self._isend(acc.clone(), partner, self._tag(k, i, to_down), sent))
                ready.release()
            elif parent is None:
                for c in kids:
                    sends.append(self._isend(acc, c, self._tag(k, i, True), sent))
            else:
                sends.append(self._isend(acc, parent, self._tag(k, i, False), sent))
            _drain(sends, w * max(1, len(kids)))
        _drain(sends, 0)

    def _down(self, flat: torch.Tensor, k: int, chunks: list[tuple[int, int]], kids: list[str],
              parent: str, sent: dict[int, int], ready: threading.Semaphore | None = None) -> None:
        """Broadcast direction of tree ``k``: receive each final chunk from ``parent``, pass it on to ``kids``.

        At an end of a link root (``ready`` given, ``parent`` = the other end)
        the chunk received is the other side's partial sum: it is added to
        this side's, once :meth:`_up` has released chunk ``i`` of this side;
        ``A + B`` here and ``B + A`` at the other end are the same IEEE sum, so
        both sides broadcast identical bits.  Its own thread either way, so a
        side never waits a link delay per chunk for the other's.  The root
        receives on the reduce tag (the pair sends as a child does), everyone
        else on the broadcast tag.
        """
        w = self.window
        on_down_tag = self.dc != self.plan.trees[k].root
        recvs: deque[tuple[Any, torch.Tensor]] = deque()

        def post(i: int) -> None:
            a, b = chunks[i]
            into = flat[a:b] if ready is None else torch.empty(b - a, dtype=flat.dtype)
            recvs.append(self._irecv(into, parent, self._tag(k, i, on_down_tag)))

        for i in range(min(w, len(chunks))):
            post(i)
        sends: deque[tuple[Any, torch.Tensor]] = deque()
        for i, (a, b) in enumerate(chunks):
            work, buf = recvs.popleft()
            work.wait()
            if ready is not None:
                ready.acquire()
                flat[a:b].add_(buf)
            if i + w < len(chunks):
                post(i + w)
            for c in kids:
                sends.append(self._isend(flat[a:b], c, self._tag(k, i, True), sent))
            _drain(sends, w * max(1, len(kids)))
        _drain(sends, 0)


def ring_chunk_bounds(numel: int, n: int, chunks: int) -> list[list[tuple[int, int]]]:
    """Element ranges of the ring's ``n`` segments, each cut into ``chunks`` (empty ranges kept as ``(a, a)``)."""
    out = []
    for i in range(n):
        a, b = numel * i // n, numel * (i + 1) // n
        cuts = [a + (b - a) * j // chunks for j in range(chunks + 1)]
        out.append(list(zip(cuts, cuts[1:])))
    return out


class RingRelayAllReduce(_LeaderScheme):
    """Ring all-reduce among DC leaders in the order ``ring``, each hop relayed along ``routes``.

    ``routes[(a, b)]``: the DCs hop ``a -> b`` of the ring crosses (``[a, b]``
    when direct); the leaders of the DCs in between forward its chunks (what
    :func:`testbed.planning.baselines.ring_relay_cost` plans: widest paths).
    The flat tensor is cut into ``n`` segments of ``chunks`` chunks; in
    ``2 (n-1)`` steps (reduce-scatter, then all-gather) the leader at ring
    position ``p`` sends segment ``p - s`` (``p + 1 - t`` in the all-gather)
    and receives ``p - s - 1`` (``p - t``), chunk by chunk: chunk ``j`` of
    step ``s`` leaves as soon as chunk ``j`` of step ``s - 1`` has arrived,
    with a window of receives posted ahead (see the module docstring).  Every
    segment's sum is computed once and copied, so all ranks end bit-identical.
    Relays run on their own threads, one per hop they forward.
    """

    def __init__(self, ring: Sequence[str], routes: Mapping[tuple[str, str], Sequence[str]] | None, rank: int,
                 dc_of_rank: Mapping[int, str], leaders: Mapping[str, int] | None = None,
                 group_of_dc: Mapping[str, Any] | None = None, *, chunks: int = 1, average: bool = False,
                 tag_base: int = 0, window: int = DEFAULT_WINDOW) -> None:
        super().__init__(ring, rank, dc_of_rank, leaders, group_of_dc, average=average, tag_base=tag_base,
                         window=window, field_name="ring")
        n = len(self.dcs)
        if len(set(self.dcs)) != n:
            raise ValidationError("ring", f"ring {list(self.dcs)} names a DC twice", "list every DC once")
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValidationError("chunks", f"chunks per segment must be an integer >= 1, got {chunks!r}", "give e.g. 16")
        self.chunks = chunks
        self.hops = [(self.dcs[i], self.dcs[(i + 1) % n]) for i in range(n)]
        self.routes: dict[tuple[str, str], tuple[str, ...]] = {}
        for a, b in self.hops:
            r = tuple((routes or {}).get((a, b), (a, b)))
            if len(r) < 2 or r[0] != a or r[-1] != b or len(set(r)) != len(r) or not set(r) <= set(self.dcs):
                raise ValidationError(f"routes.{a}->{b}", f"route {list(r)} does not lead from {a} to {b} over DCs",
                                      "give the DCs the hop crosses, from its start to its end, each once")
            self.routes[(a, b)] = r
        self.steps = 2 * (n - 1)

    @property
    def tag_span(self) -> int:
        return 2 + len(self.hops) * self.steps * self.chunks

    def _tag(self, hop: int, step: int, chunk: int) -> int:
        return self.tag_base + 2 + (hop * self.steps + step) * self.chunks + chunk

    def _send_seg(self, pos: int, step: int) -> int:
        n = len(self.dcs)
        return (pos - step) % n if step < n - 1 else (pos + 1 - (step - n + 1)) % n

    def _leaders(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        bounds = ring_chunk_bounds(flat.numel(), len(self.dcs), self.chunks)
        jobs = [_bind(self._ring, flat, bounds, sent)]
        for h, (a, b) in enumerate(self.hops):
            r = self.routes[(a, b)]
            if self.dc in r[1:-1]:
                i = r.index(self.dc)
                jobs.append(_bind(self._relay, flat, bounds, h, r[i - 1], r[i + 1], sent))
        _run_threads(jobs)

    def _units(self, bounds: list[list[tuple[int, int]]], pos: int) -> list[tuple[int, int, int, int]]:
        """(step, chunk, start, end) of the non-empty chunks the leader at ring position ``pos`` sends, in order."""
        out = []
        for s in range(self.steps):
            for j, (a, b) in enumerate(bounds[self._send_seg(pos, s)]):
                if b > a:
                    out.append((s, j, a, b))
        return out

    def _ring(self, flat: torch.Tensor, bounds: list[list[tuple[int, int]]], sent: dict[int, int]) -> None:
        n = len(self.dcs)
        p = self.dcs.index(self.dc)
        out_hop, in_hop = p, (p - 1) % n
        first = self.routes[self.hops[out_hop]][1]
        last = self.routes[self.hops[in_hop]][-2]
        incoming = self._units(bounds, in_hop)  # what the previous leader sends, in its order
        w = self.window
        recvs: deque[tuple[Any, torch.Tensor]] = deque()
        nxt = 0

        def post() -> None:
            nonlocal nxt
            if nxt < len(incoming):
                s, j, a, b = incoming[nxt]
                recvs.append(self._irecv(torch.empty(b - a, dtype=flat.dtype), last, self._tag(in_hop, s, j)))
                nxt += 1

        for _ in range(w):
            post()
        got = 0

        def consume_step(step: int, upto_chunk: int) -> None:
            """Apply the received chunks of ``step`` up to chunk ``upto_chunk`` (inclusive)."""
            nonlocal got
            while got < len(incoming) and incoming[got][0] == step and incoming[got][1] <= upto_chunk:
                _, _, a, b = incoming[got]
                work, buf = recvs.popleft()
                work.wait()
                if step < n - 1:
                    flat[a:b].add_(buf)
                else:
                    flat[a:b].copy_(buf)
                got += 1
                post()

        sends: deque[tuple[Any, torch.Tensor]] = deque()
        for s in range(self.steps):
            for j, (a, b) in enumerate(bounds[self._send_seg(p, s)]):
                if s > 0:
                    consume_step(s - 1, j)
                if b > a:
                    sends.append(self._isend(flat[a:b], first, self._tag(out_hop, s, j), sent))
                    _drain(sends, w)
        consume_step(self.steps - 1, self.chunks)
        _drain(sends, 0)

    def _relay(self, flat: torch.Tensor, bounds: list[list[tuple[int, int]]], hop: int, src: str, dst: str,
               sent: dict[int, int]) -> None:
        """Forward hop ``hop``'s chunks from ``src`` to ``dst`` (this DC lies on its route)."""
        units = self._units(bounds, hop)
        w = self.window
        recvs: deque[tuple[Any, torch.Tensor]] = deque()
        for s, j, a, b in units[:w]:
            recvs.append(self._irecv(torch.empty(b - a, dtype=flat.dtype), src, self._tag(hop, s, j)))
        sends: deque[tuple[Any, torch.Tensor]] = deque()
        for i, (s, j, _a, _b) in enumerate(units):
            work, buf = recvs.popleft()
            work.wait()
            if i + w < len(units):
                s2, j2, a2, b2 = units[i + w]
                recvs.append(self._irecv(torch.empty(b2 - a2, dtype=flat.dtype), src, self._tag(hop, s2, j2)))
            sends.append(self._isend(buf, dst, self._tag(hop, s, j), sent))
            _drain(sends, w)
        _drain(sends, 0)


class HierarchicalAllReduce(_LeaderScheme):
    """Hierarchical all-reduce on collectives: reduce in the DC, gloo ring among leaders, broadcast in the DC.

    ``group_of_dc`` (from :func:`make_dc_groups`) and ``leader_group`` (from
    :func:`make_leader_group`) must be made by every rank beforehand (without
    ``group_of_dc`` the intra-DC phases fall back to point-to-point).  The
    leaders' ``dist.all_reduce`` is gloo's ring in the group's rank order; the
    returned byte counts are that ring's ``2 (n-1)/n * S`` to the next leader
    (what gloo's ring sends, as ``testbed/training/collectives.py`` documents
    and the byte-accounting tests measured); the collective intra-DC phases
    are not counted.
    """

    def __init__(self, dcs: Sequence[str], rank: int, dc_of_rank: Mapping[int, str],
                 leaders: Mapping[str, int] | None = None, group_of_dc: Mapping[str, Any] | None = None,
                 leader_group: Any = None, *, average: bool = False, tag_base: int = 0) -> None:
        super().__init__(dcs, rank, dc_of_rank, leaders, group_of_dc, average=average, tag_base=tag_base,
                         field_name="topology")
        self.leader_group = leader_group

    def _leaders(self, flat: torch.Tensor, sent: dict[int, int]) -> None:
        dist.all_reduce(flat, group=self.leader_group)
        ring = sorted(self.leaders.values())
        n = len(ring)
        nxt = ring[(ring.index(self.rank) + 1) % n]
        sent[nxt] = sent.get(nxt, 0) + int(round(2 * (n - 1) / n * flat.numel())) * flat.element_size()


_count_lock = threading.Lock()


def _count(sent: dict[int, int], peer: int, buf: torch.Tensor) -> None:
    with _count_lock:
        sent[peer] = sent.get(peer, 0) + buf.numel() * buf.element_size()


def _drain(works: deque[tuple[Any, torch.Tensor]], keep: int) -> None:
    """Wait for the oldest works until at most ``keep`` are in flight (each work is waited once)."""
    while len(works) > keep:
        works.popleft()[0].wait()


def _bind(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    return lambda: fn(*args)


def _run_threads(jobs: list[Callable[[], None]]) -> None:
    """Run the per-tree jobs concurrently; re-raise the first failure."""
    errors: list[BaseException] = []

    def wrap(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
