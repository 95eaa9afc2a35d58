"""Building blocks for overlapping gradient synchronization with compute (PGCS and its baselines).

Our reading of PGCS (closed-access paper; docs/DESIGN.md "Training model"): E >= 2
experts (separate parameter sets); at step ``t`` the main thread computes
expert ``t mod E`` while a *communication thread* synchronizes the gradients
of earlier experts; an expert's sync and update complete before its next
compute (no stale update).  This module holds what that needs, so the
scheme (``schemes/pgcs.py``) is only the schedule:

* :class:`CommThread` / :class:`Ticket` - a FIFO of communication jobs run on
  one dedicated thread; the main thread waits on a job's ticket.
* :class:`GradSync` - the sum of a flat CPU buffer over all workers by ring
  all-reduce, hierarchical all-reduce, or the BLP executor, recorded as
  spans with their payload bytes.  It creates its **own** process groups
  (``dist.new_group``) at set-up, used only by whichever thread runs the
  syncs: gloo collectives on one group from two threads are unsafe.  The
  BLP executor (``testbed.planning.executor``) sends point-to-point on the
  default group; in PGCS only the communication thread communicates while
  it lives, so the default group has a single user as well.
* :class:`ExpertSlot` / :func:`build_experts` - one expert's model in a flat
  buffer (:class:`~testbed.training.flat.FlatModel`, one extra slot for a
  stop flag that travels in the same all-reduce), its optimizer and
  update count, and CPU staging when the model is on CUDA (gloo sends CPU
  tensors).
* :class:`ExpertEvaluator` - held-out loss per expert on a background
  thread, written to ``metrics.csv`` with the ``expert`` column set.
* :func:`make_buckets` - DDP-style gradient buckets (reverse parameter order).

Standard torch.distributed only; nothing here imports Mininet.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from testbed.collect.recorder import Recorder, events_path
from testbed.training import dist as tdist
from testbed.training.collectives import HierarchicalAllReduce, ring_allreduce
from testbed.training.evaluator import SnapshotEvaluator
from testbed.training.flat import FlatModel, make_optimizer
from testbed.training.jobs import Job
from testbed.training.workloads import build_workload
from testbed.training.workloads.base import Workload

__all__ = ["CommThread", "ExpertEvaluator", "ExpertSlot", "GradSync", "Ticket", "build_experts",
           "comm_recorder", "make_buckets", "wait_ticket"]


# ----------------------------------------------------------------------------- comm thread
class Ticket:
    """Completion of one communication job: ``result`` or the exception it raised."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self._done.set()

    def wait(self, slice_s: float = 1.0) -> Any:
        """Block until done (in slices, so signals reach the main thread); re-raise the job's error."""
        while not self._done.wait(slice_s):
            pass
        if self.error is not None:
            raise RuntimeError("communication job failed") from self.error
        return self.result

    @staticmethod
    def completed(result: Any) -> Ticket:
        t = Ticket()
        t.finish(result)
        return t


class CommThread:
    """One thread running submitted jobs in order (the order is the same on every worker).

    After a job fails, every later job fails at once with the same error
    (its collective partners may be gone), so no waiter hangs.
    """

    def __init__(self, name: str = "comm") -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], Ticket] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Ticket:
        ticket = Ticket()
        self._q.put((fn, ticket))
        return ticket

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, ticket = item
            if self._error is not None:
                ticket.finish(error=self._error)
                continue
            try:
                ticket.finish(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                self._error = e
                ticket.finish(error=e)

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the queued jobs and stop; a thread stuck in a collective is left (daemon)."""
        self._q.put(None)
        self._thread.join(timeout_s)


def wait_ticket(ticket: Ticket, rec: Recorder, step: int, **extra: Any) -> Any:
    """Wait for ``ticket``; if that blocks, record the blocked time as a ``wait`` span (exposed sync)."""
    if ticket.done():
        return ticket.wait()
    start = rec.now_ns()
    try:
        return ticket.wait()
    finally:
        rec.emit("wait", start, rec.now_ns() - start, step=step, **extra)


def comm_recorder(job: Job, main: Recorder) -> Recorder:
    """Span recorder of the communication thread (role ``comm``), on the main recorder's clock."""
    rec = Recorder(events_path(job.out_dir, job.host, "comm", job.rank), host=job.host, dc=job.dc, rank=job.rank,
                   role="comm", t0_ns=job.t0_ns, static={"scheme": job.training.scheme.name})
    # Same monotonic->wall mapping as the main thread's recorder, so the order of spans on the
    # two tracks (sync end vs. next compute start) is exact, not subject to two clock readings.
    rec._offset = main._offset  # noqa: SLF001
    return rec


# ----------------------------------------------------------------------------- synchronization
class GradSync:
    """Sum a flat CPU buffer over all workers; ``kind`` = ``allreduce`` | ``hierarchical`` | ``blp``.

    Construct on every worker in the same order (it creates process groups,
    a collective call).  ``__call__(buf, rec, step, **extra)`` runs one sync
    and records its spans on ``rec`` (``wan_sync`` across DCs, ``intra_sync``
    inside one; extra keys such as ``expert`` are added) and returns the
    payload bytes this worker sent.
    """

    def __init__(self, job: Job, kind: str, plan: Any = None) -> None:
        self.kind = kind
        self.rank = job.rank
        peers = self.peers = job.peers
        everyone = list(range(job.world_size))
        timeout = timedelta(seconds=job.training.comm_timeout_s)
        self.group = dist.new_group(everyone, timeout=timeout) if job.world_size > 1 else None
        self.ring = tdist.ring_order(peers, everyone)
        self.phase = tdist.sync_phase(peers, everyone)
        if kind == "hierarchical":
            self.hier = HierarchicalAllReduce(peers, self.rank, job.training.comm_timeout_s)
        elif kind == "blp":
            from testbed.planning.executor import BlpAllReduce, make_dc_groups

            if plan is None:
                raise ValueError("sync: blp needs a plan")
            self.plan = plan
            dc_of_rank = {p.rank: p.dc for p in peers}
            # intra-DC reduce/broadcast as gloo collectives on per-DC groups: gloo's point-to-point
            # send/recv stalls in ~40 ms steps on shaped links (see collectives.ring_allreduce)
            self.blp = BlpAllReduce(plan, self.rank, dc_of_rank, group_of_dc=make_dc_groups(dc_of_rank))
        elif kind != "allreduce":
            raise ValueError(f"unknown sync kind {kind!r}")

    def __call__(self, buf: torch.Tensor, rec: Recorder, step: int, **extra: Any) -> int:
        if self.kind == "allreduce":
            with rec.span(self.phase, step=step, op="ring_allreduce", peers=len(self.ring), **extra) as sp:
                sent = ring_allreduce(buf, self.ring, self.group)
                sp.set(bytes=sent, **tdist.wan_fields(tdist.ring_wan_to(sent, self.ring, self.rank, self.peers)))
            return sent
        if self.kind == "blp":
            with rec.span(self.phase, step=step, op="blp", predicted_s=round(self.plan.predicted_time_s, 6),
                          **extra) as sp:
                per_peer = self.blp(buf)
                sent = sum(per_peer.values())
                sp["bytes"] = sent
                wan_to: dict[str, int] = {}
                for r, b in per_peer.items():
                    if self.peers[r].dc != self.peers[self.rank].dc:
                        wan_to[self.peers[r].dc] = wan_to.get(self.peers[r].dc, 0) + b
                sp.set(**tdist.wan_fields(wan_to))
            return sent
        return self.hier(buf, rec, step, **extra)


# ----------------------------------------------------------------------------- experts
@dataclass
class ExpertSlot:
    """One expert: its workload (data, loss, evaluation), flat model, optimizer, update count."""

    index: int
    workload: Workload
    flat: FlatModel  # extra >= 1: grad_buf[n] carries the stop flag
    opt: torch.optim.Optimizer
    updates: int = 0
    backward_s: float = 0.0  # duration of the last backward (ddp_overlap pads the step before it)
    direct: bool = False  # collectives take the device buffer itself (backend: nccl), no CPU staging
    _staging: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return self.flat.n

    def sync_buffer(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """View of ``grad_buf[lo:hi]`` (default: the gradient plus the flag slot) for the collective.

        On CPU, and on CUDA under NCCL (``direct``), it is the gradient buffer
        itself; on CUDA with gloo a pinned CPU staging copy (made here, by the
        caller's thread).
        """
        hi = self.n + 1 if hi is None else hi
        if self.flat.device.type == "cpu" or self.direct:
            return self.flat.grad_buf[lo:hi]
        if self._staging is None:
            self._staging = torch.zeros(self.n + 1, pin_memory=torch.cuda.is_available())
        self._staging[lo:hi].copy_(self.flat.grad_buf[lo:hi])
        return self._staging[lo:hi]

    def unstage(self, lo: int = 0, hi: int | None = None) -> None:
        """Copy a synchronized range back to the device (no-op on CPU)."""
        hi = self.n + 1 if hi is None else hi
        if self._staging is not None and self.flat.device.type != "cpu":
            self.flat.grad_buf[lo:hi].copy_(self._staging[lo:hi])


def build_experts(ctx: Any, count: int) -> list[ExpertSlot]:
    """The E experts of this run.

    A multi-expert workload (one with ``expert_workloads()``) gives its own
    experts; any other workload is replicated: expert 0 is the context's
    workload and model, expert ``k`` a copy seeded ``seed + 1000 k``.
    """
    from testbed.training.workloads.experts import expert_seed

    tc = ctx.job.training
    wl = ctx.workload
    slots = []
    if hasattr(wl, "expert_workloads"):
        subs = wl.expert_workloads()
        if len(subs) != count:
            raise ValueError(f"workload has {len(subs)} experts, scheme expects {count}")
        flats = [FlatModel(s.build_model(), ctx.device, extra=1) for s in subs]
    else:
        subs = [wl] + [build_workload(tc.workload.name, tc.workload.params, expert_seed(tc.seed, k))
                       for k in range(1, count)]
        flats = [ctx.flat] + [FlatModel(s.build_model(), ctx.device, extra=1) for s in subs[1:]]
    from testbed.training.lr import resolve_job

    lr = resolve_job(ctx.job).for_client()  # the scheme's lr rule (testbed.training.lr)
    for k, (sub, flat) in enumerate(zip(subs, flats)):
        slots.append(ExpertSlot(k, sub, flat, make_optimizer(tc.optimizer, flat.plist, lr=lr),
                                direct=bool(getattr(ctx, "comm_on_device", False))))
    return slots


def make_buckets(flat: FlatModel, buckets: int) -> list[tuple[int, int, list[int]]]:
    """DDP-style buckets: ``(lo, hi, param indices)`` in reverse parameter order.

    As DDP's ``bucket_cap_mb``: walking the parameters backwards, a bucket is
    closed once it holds at least ``n / buckets`` elements.  A parameter is
    never split, so the count is about ``buckets`` (fewer when one parameter
    is most of the model, e.g. 1 for the synthetic workload's single
    vector).  Ranges are contiguous in the flat gradient and together cover
    ``[0, n)``; the first bucket (the last parameters, ready first in
    backward) is returned first.
    """
    sizes = [p.numel() for p in flat.plist]
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)
    cap = flat.n / max(1, buckets)
    out: list[tuple[int, int, list[int]]] = []
    hi, members = flat.n, []
    for i in reversed(range(len(sizes))):
        members.append(i)
        if hi - offs[i] >= cap:
            out.append((offs[i], hi, members))
            hi, members = offs[i], []
    if members:
        out.append((0, hi, members))
    return out


# ----------------------------------------------------------------------------- evaluation
class ExpertEvaluator(SnapshotEvaluator):
    """Held-out evaluation per expert on a background thread; rows ``expert = k`` in ``metrics.csv``.

    ``submit`` snapshots an expert's parameters (a copy) and returns; the
    thread evaluates the snapshots in order (none dropped, see
    :mod:`.evaluator`), writes ``step,wall_s,loss,acc,expert,updates,samples``
    and an ``eval`` span.  ``reached`` is set when every expert meets ``target``;
    ``gave_up`` when any expert's latest evaluation meets the ``give_up`` rule.
    """

    def __init__(self, workloads: Sequence[Workload], rec: Recorder, metrics_path: str | Path,
                 target: Any | None = None, device: torch.device | str = "cpu", give_up: Any | None = None) -> None:
        self.workloads = list(workloads)
        self.flats = [FlatModel(w.build_model(), device) for w in self.workloads]
        for f in self.flats:
            f.model.eval()
        self.last: dict[int, dict[str, Any]] = {}
        super().__init__(rec, metrics_path, target, "expert-eval", give_up)

    def submit(self, expert: int, step: int, updates: int, params: torch.Tensor, wall_s: float | None = None,
               samples: int | None = None) -> None:
        self._put(expert, step, updates, params, wall_s, samples)

    def final(self, expert: int, step: int, updates: int, params: torch.Tensor, samples: int | None = None) -> None:
        """Evaluate the expert's final state unless that update count was already evaluated."""
        self.drain()
        last = self.last.get(expert)
        if last is None or last["updates"] != updates:
            self.submit(expert, step, updates, params, samples=samples)
        self.drain()

    def _evaluate(self, expert: int, step: int, updates: int, wall_s: float, samples: int | None,
                  snap: torch.Tensor) -> None:
        flat = self.flats[expert]
        with self.rec.span("eval", step=step, expert=expert, updates=updates, backlog=len(self._pending),
                           dropped=self.dropped) as sp:
            flat.load(snap.to(flat.device))
            res = self.workloads[expert].evaluate(flat.model)
            sp.set(loss=res.get("loss"), acc=res.get("acc"))
            self.last[expert] = {"step": step, "updates": updates, "wall_s": wall_s, "samples": samples, **res}
            if self._judge(list(self.last.values()), len(self.last) == len(self.workloads)):
                sp.set(gave_up=True)
        self.writer.write(step, wall_s, res.get("loss"), res.get("acc"), updates, expert=expert, samples=samples)
