"""When each held packet leaves: the pure timing logic, no sockets, no clock.

Kept apart from the netlink code so it can be tested exhaustively without root
and so both queue mechanisms (raw netlink, the ``netfilterqueue`` binding)
share one definition of delay, jitter and loss.

Two structures, both O(log n) or O(1) per packet, never O(n):

* a FIFO (``deque``) when packets keep their order (no jitter, or jitter with
  ``reorder=False``): release time ``max(previous release, arrival + d(arrival))``
  with ``d`` the interval's delay of :mod:`traffic_control.jitter`, is
  non-decreasing, so the head is always the next packet due;
* a heap keyed by release time when jitter may reorder (a draw per packet).

A FIFO release is a *prefix of the held packets in kernel id order*, which is
what lets the caller accept it with one batch verdict ("every id up to N").
"""

from __future__ import annotations

import heapq
import random
from collections import deque

from ..jitter import DelayProcess, interval_s
from .shape import ImpairmentShape


class Scheduler:
    """Holds packet ids with their release times; decides loss at admission."""

    def __init__(self, shape: ImpairmentShape) -> None:
        self._fifo: deque[tuple[float, int]] = deque()
        self._heap: list[tuple[float, int]] = []
        self._last_due = float("-inf")
        self._rng = random.Random(shape.seed)
        self.shape = shape
        self._configure(shape)

    def _configure(self, shape: ImpairmentShape) -> None:
        self._delay = shape.delay_s
        self._jitter = shape.jitter_s
        self._loss = shape.loss_pct / 100.0
        # Gilbert-Elliott (netem's loss_gilb_ell, same order of draws): per packet, first the state
        # may move, then the loss is drawn with the probability of the state the packet arrived in
        self._ge = None if not shape.ge_p_pct else (shape.ge_p_pct / 100, shape.ge_r_pct / 100,
                                                     shape.ge_loss_bad_pct / 100, shape.ge_loss_good_pct / 100)
        if not hasattr(self, "_ge_bad"):
            self._ge_bad = False
        # netem's reorder (netem_enqueue): a packet is delayed (and counted) unless the count has reached
        # gap - 1 and the draw says "at once"; one sent at once resets the count
        self._reorder_p = shape.reorder_pct / 100.0
        self._gap = shape.reorder_gap
        if not hasattr(self, "_counter"):
            self._counter = 0
        self._reorders = shape.reorders
        self._process = DelayProcess(shape.delay_s, shape.jitter_s, shape.distribution, shape.seed,
                                     interval_s(shape.jitter_s, shape.interval_s))
        self._k: int | None = None
        self._d = shape.delay_s

    def set_shape(self, shape: ImpairmentShape) -> None:
        """Apply a new shape to packets admitted from now on.

        Held packets keep their release times (as netem does on ``change``).
        In FIFO mode a shorter delay therefore waits behind packets admitted
        earlier until they leave: order is never broken by a change.  The RNG
        is reseeded only when the seed itself changes, so changing the delay
        does not replay the same loss pattern.
        """
        if shape.seed != self.shape.seed:
            self._rng = random.Random(shape.seed)
        self.shape = shape
        self._configure(shape)

    def _ge_lost(self, rng: random.Random) -> bool:
        p, r, loss_bad, loss_good = self._ge
        bad = self._ge_bad
        if rng.random() < (r if bad else p):
            self._ge_bad = not bad
        return rng.random() < (loss_bad if bad else loss_good)

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)

    def admit(self, pkt_id: int, now: float) -> bool:
        """Hold ``pkt_id`` arrived at ``now``; False means: drop it (loss)."""
        rng = self._rng
        if self._loss and rng.random() < self._loss:
            return False
        if self._ge is not None and self._ge_lost(rng):
            return False
        if self._reorder_p:
            if self._counter >= self._gap - 1 and rng.random() < self._reorder_p:
                self._counter = 0
                heapq.heappush(self._heap, (now, pkt_id))  # sent at once: overtakes the held packets
                return True
            self._counter += 1
        if self._reorders:  # a draw per packet: packets overtake each other
            heapq.heappush(self._heap, (now + self._process.draw(rng), pkt_id))
        else:
            due = now + self._delay
            if self._jitter:  # the interval's delay (traffic_control.jitter): order and distribution kept
                k = self._process.index(now)
                if k != self._k:
                    self._k, self._d = k, self._process.value(k)
                due = now + self._d
            if due < self._last_due:
                due = self._last_due
            self._last_due = due
            self._fifo.append((due, pkt_id))
        return True

    def next_due(self) -> float | None:
        """Release time of the earliest held packet, or None when none is held."""
        fifo, heap = self._fifo, self._heap
        if fifo:
            return min(fifo[0][0], heap[0][0]) if heap else fifo[0][0]
        return heap[0][0] if heap else None

    def pop_due(self, now: float, out: list[int]) -> bool:
        """Append the ids due by ``now`` to ``out``; True if they may go as one batch.

        Batchable means: only FIFO packets were released and no heap packet is
        held, so every held id up to the last one released is being released.
        """
        fifo, heap = self._fifo, self._heap
        from_heap = False
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[1])
            from_heap = True
        while fifo and fifo[0][0] <= now:
            out.append(fifo.popleft()[1])
        return not from_heap and not heap

    def pop_all(self, out: list[int]) -> None:
        """Append every held id (shutdown: let them go now)."""
        out.extend(pkt_id for _, pkt_id in self._heap)
        out.extend(pkt_id for _, pkt_id in self._fifo)
        self._heap.clear()
        self._fifo.clear()
