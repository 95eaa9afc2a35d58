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
   climbs while chunk ``i`` descends;
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

Tensors must be on the CPU for gloo (a CUDA tensor is copied to the CPU and
back).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
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


class BlpAllReduce:
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
        self.plan = plan
        self.rank = rank
        self.dc_of_rank = dict(dc_of_rank)
        if rank not in self.dc_of_rank:
            raise ValidationError("dc_of_rank", f"rank {rank} has no DC", "map every participating rank to its DC")
        unknown = sorted(set(self.dc_of_rank.values()) - set(plan.dcs))
        if unknown:
            raise ValidationError("dc_of_rank", f"DCs {unknown} are not in the plan", f"use DCs of {list(plan.dcs)}")
        if leaders is None:
            leaders = {}
            for r in sorted(self.dc_of_rank):
                leaders.setdefault(self.dc_of_rank[r], r)
        self.leaders = dict(leaders)
        for dc in plan.dcs:
            lead = self.leaders.get(dc)
            if lead is None or self.dc_of_rank.get(lead) != dc:
                raise ValidationError(f"leaders.{dc}", f"DC {dc!r} has no leader rank in it (got {lead!r})",
                                      "give each DC of the plan one of its own ranks as leader")
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
        self._children = [t.children() for t in plan.trees]
        self._stride = 2 * (max(t.chunks for t in plan.trees) + 1)

    # ------------------------------------------------------------ tags
    @property
    def tag_span(self) -> int:
        """Tags this instance uses: ``[tag_base, tag_base + tag_span)``; space concurrent instances that far apart."""
        return 2 + len(self.plan.trees) * self._stride

    def _tag(self, tree: int, chunk: int, down: bool) -> int:
        return self.tag_base + 2 + tree * self._stride + 2 * chunk + int(down)

    # ------------------------------------------------------------ public
    def __call__(self, tensor: torch.Tensor) -> dict[int, int]:
        """Reduce ``tensor`` (any shape, contiguous) in place; returns bytes sent per peer rank."""
        if not tensor.is_contiguous():
            raise ValueError("BlpAllReduce needs a contiguous tensor (flatten the gradients into one buffer)")
        if tensor.is_cuda:
            host = tensor.detach().cpu()
            sent = self._run(host.view(-1))
            tensor.copy_(host)
            return sent
        return self._run(tensor.detach().view(-1))

    # ------------------------------------------------------------ phases
    def _run(self, flat: torch.Tensor) -> dict[int, int]:
        sent: dict[int, int] = {}
        self._intra_reduce(flat, sent)
        if self.is_leader and len(self.plan.dcs) > 1:
            self._trees(flat, sent)
        self._intra_broadcast(flat, sent)
        if self.average:
            flat.div_(self.world)
        return sent

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
            jobs.append(_bind(self._up, flat, k, chunks, kids, parent, sent))
            if parent is not None:
                jobs.append(_bind(self._down, flat, k, chunks, kids, parent, sent))
        _run_threads(jobs)

    def _up(self, flat: torch.Tensor, k: int, chunks: list[tuple[int, int]], kids: list[str],
            parent: str | None, sent: dict[int, int]) -> None:
        """Reduce direction of tree ``k`` at this leader.

        Chunk ``i``: add the children's partial sums into this rank's slice (in
        place: the final value later overwrites it) and send it to the parent;
        at the root the slice is then final and goes down to the children.
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
            if parent is None:
                for c in kids:
                    sends.append(self._isend(acc, c, self._tag(k, i, True), sent))
            else:
                sends.append(self._isend(acc, parent, self._tag(k, i, False), sent))
            _drain(sends, w * max(1, len(kids)))
        _drain(sends, 0)

    def _down(self, flat: torch.Tensor, k: int, chunks: list[tuple[int, int]], kids: list[str],
              parent: str, sent: dict[int, int]) -> None:
        """Broadcast direction of tree ``k`` at a non-root leader: receive each final chunk, pass it on."""
        w = self.window
        recvs: deque[tuple[Any, torch.Tensor]] = deque()

        def post(i: int) -> None:
            a, b = chunks[i]
            recvs.append(self._irecv(flat[a:b], parent, self._tag(k, i, True)))

        for i in range(min(w, len(chunks))):
            post(i)
        sends: deque[tuple[Any, torch.Tensor]] = deque()
        for i, (a, b) in enumerate(chunks):
            work, _ = recvs.popleft()
            work.wait()
            if i + w < len(chunks):
                post(i + w)
            for c in kids:
                sends.append(self._isend(flat[a:b], c, self._tag(k, i, True), sent))
            _drain(sends, w * max(1, len(kids)))
        _drain(sends, 0)

    # ------------------------------------------------------------ p2p helpers
    def _irecv(self, buf: torch.Tensor, dc: str, tag: int) -> tuple[Any, torch.Tensor]:
        return dist.irecv(buf, self.leaders[dc], tag=tag), buf

    def _isend(self, buf: torch.Tensor, dc: str, tag: int, sent: dict[int, int]) -> tuple[Any, torch.Tensor]:
        peer = self.leaders[dc]
        work = dist.isend(buf, peer, tag=tag)
        _count(sent, peer, buf)
        return work, buf


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
