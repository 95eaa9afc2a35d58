"""PGCS workers: overlap one expert's gradient sync with the next expert's compute.

Our reading of PGCS (the paper is closed-access; only its abstract is public,
see docs/DESIGN.md "Training model" and ``schemes/pgcs_params.py``):

* the model is E >= 2 experts with separate parameter sets (the ``experts``
  workload, or E seeded copies of a single-model workload such as
  ``synthetic``), each with its own optimizer, trained data-parallel by all
  workers of all DCs;
* at global step ``t`` every worker computes the gradient of expert
  ``k = t mod E`` on its shard of that expert's ``t // E``-th batch, on the
  main thread, and then hands it to a communication thread, which sums it
  over all workers (``sync``: ring all-reduce, hierarchical, or the BLP
  executor following a plan), divides by the worker count and applies the
  expert's optimizer step - while the main thread already computes the next
  expert;
* before computing expert ``k`` again (step ``t + E``) the main thread waits
  until the sync and update of step ``t`` are done: **no update is stale**,
  so the result equals compute-then-sync bit for bit (same sums in the same
  order), only sooner.  The time it blocks there is the exposed sync.

Baselines in the same code, on the same experts, data and steps:

* ``pgcs`` with ``overlap: false`` - sequential: compute, then sync and
  update on the main thread;
* ``ddp_overlap`` - DDP-style bucketed overlap inside one expert: during the
  expert's backward, each bucket of its gradient (reverse parameter order)
  goes to the communication thread as soon as all its gradients exist; the
  optimizer step waits for all buckets.  A set compute time (the synthetic
  workload's pad, the emulated accelerator, the slowdown model) is spent as a
  real step spends it: a third before backward (the forward), two thirds
  during backward, each parameter's share (by size) before its gradient
  counts as ready, so buckets fill one after another while backward runs, as
  in real DDP, and the step still takes the set time (the expert's previous
  real backward time counted as already spent).  Backward = 2 x forward is
  the usual estimate (4N against 2N FLOPs per token, Kaplan et al. 2020).
  Before 2026-12-05 the whole set time came before backward, so every
  bucket was ready at once, at its end, and nothing overlapped: with the
  synthetic workload (then always one tensor, one bucket) ddp_overlap
  measured the same as sequential.  With pgcs the set time is spent after
  backward, as in ``runtime.WorkerContext.compute``.

Records (docs/CONTRACTS.md):

* main thread (role ``worker``): ``compute`` (``step``, ``expert``,
  ``loss``, ``slowdown_s``), ``wait`` (``what: expert_sync`` - blocked on an
  expert's unfinished sync before its next compute; ``drain`` at the end;
  ``bucket_sync`` in ddp_overlap) = the exposed sync time per step; in the
  sequential baseline the sync spans themselves are on this track, all of
  their time exposed;
* communication thread (role ``comm``, file ``<host>.comm.<rank>.jsonl``):
  ``wan_sync`` (``intra_sync`` for phases inside a DC) with ``expert``,
  ``bytes``, ``op`` (and ``bucket``), and ``apply`` (``expert``,
  ``updates``) when the update is made there;
* rank 0 writes ``metrics.csv``: one row per expert evaluation, ``expert``
  = k, ``updates`` = that expert's updates so far, ``step`` = global steps
  computed when that update's gradient was made (row ``0,..,k,0`` is the
  initial model); on the trial's cadence (``evaluator.EvalCadence``: when the
  samples of all workers cross a multiple of ``eval_every_samples``, every
  expert as it is then, so the whole model is evaluated as in every other
  scheme; else the expert just updated, every ``eval_every`` of its updates)
  and at the end.

Stopping: every sync buffer carries one extra slot, each worker's stop vote
(wall-clock limit; rank 0 also when every expert met the target).  With
overlap the main thread learns sync ``t``'s sum when it waits for it, before
step ``t + E``, so every worker stops before step ``t + E`` when sync ``t``
carried a vote (the sequential baseline uses the same rule, so both stop
at the same step); ``ddp_overlap`` stops after the step whose sync carried it.
``stop.steps`` counts global steps (each computes one expert).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from testbed.collect.recorder import Recorder
from testbed.training import dist as tdist
from testbed.training.evaluator import EvalCadence
from testbed.training.overlap import (
    CommThread,
    ExpertEvaluator,
    ExpertSlot,
    GradSync,
    Ticket,
    build_experts,
    comm_recorder,
    make_buckets,
    wait_ticket,
)
from testbed.training.runtime import ComputeLeft, WorkerContext, save_model
from testbed.training.schema import ValidationError

__all__ = ["run"]


# backward's share of a step's compute: backward ~ 2 x forward (4N against 2N FLOPs per token,
# Kaplan et al. 2020, "Scaling Laws for Neural Language Models")
BACKWARD_SHARE = 2.0 / 3.0


class BackwardTime:
    """The backward's share of a step's set compute, spent through the gradient hooks: each parameter's
    share (``fraction`` of the model's elements) just before its gradient counts as ready, so DDP-style
    buckets become ready one after another while backward runs.

    The set time is planned before backward, counting the backward still to come at last step's length;
    a faster backward this time would end the step short of its set time, so the last share also waits
    until ``set_end`` (the planned end): the last gradient is ready when the set time is over, never
    before (a real backward of the set length ends there too)."""

    def __init__(self) -> None:
        self.left: ComputeLeft | None = None
        self.set_end = 0.0  # perf_counter() when the step's set compute ends; 0: no set time
        self.spent = 0.0  # fraction of the backward's share spent
        self.spent_s = 0.0  # and the seconds that took (not the real backward's: the next step counts that)

    def start(self, left: ComputeLeft, set_end: float) -> None:
        self.left, self.set_end, self.spent, self.spent_s = left, set_end, 0.0, 0.0

    def spend(self, fraction: float) -> None:
        if self.left is None:
            return
        share = min(fraction, 1.0 - self.spent)
        t = time.perf_counter()
        self.left.spend(BACKWARD_SHARE * share)
        self.spent += share
        if self.spent >= 1.0 - 1e-9:  # the last share: not before the set time is over
            self.left.wl.spend(self.set_end - time.perf_counter())
        self.spent_s += time.perf_counter() - t

    def finish(self) -> None:
        """What no hook spent (parameters without a gradient this step), so the step keeps its set time."""
        self.spend(1.0 - self.spent)
        self.left = None


class _Trainer:
    """State shared by the two schedules (expert pipelining, DDP buckets)."""

    def __init__(self, ctx: WorkerContext, slots: list[ExpertSlot], sync: GradSync,
                 evaluator: ExpertEvaluator | None, comm: CommThread | None, comm_rec: Recorder | None) -> None:
        self.ctx = ctx
        self.job = ctx.job
        self.tc = ctx.job.training
        self.slots = slots
        self.sync = sync
        self.evaluator = evaluator
        self.comm = comm
        self.rec = ctx.rec
        self.comm_rec = comm_rec
        self.world = ctx.job.world_size
        self.E = len(slots)
        self.steps = 0  # global steps computed
        self.cadence = EvalCadence(self.tc)

    # -- one expert's compute ---------------------------------------------------------------
    def compute(self, slot: ExpertSlot, t: int, *, during_backward: BackwardTime | None = None,
                vote: bool = False) -> float:
        """Gradient of expert ``slot`` on this worker's shard of its ``t // E``-th batch.

        ``during_backward``: spend the set compute time as a real step does, part before backward and the
        rest through the gradient hooks while it runs (DDP-style overlap); else all of it after backward."""
        ctx, wl, flat = self.ctx, slot.workload, slot.flat
        with self.rec.span("compute", step=t, expert=slot.index) as sp:
            t0 = time.perf_counter()
            batch = tuple(x.to(ctx.device, non_blocking=True)
                          for x in wl.batch(t // self.E, self.job.rank, self.world))
            flat.zero_grad()
            flat.grad_buf[flat.n] = 1.0 if vote else 0.0
            loss = wl.loss(flat.model, batch)
            fields: dict[str, Any] = {}
            if during_backward is not None:  # count the backward still to come (last time's) as spent
                t_plan = time.perf_counter()
                left = ctx.plan_compute(wl, t_plan - t0 + slot.backward_s)
                set_end = t_plan + slot.backward_s + left.pad_s + left.sleep_s if left.pad_s + left.sleep_s else 0.0
                left.spend(1.0 - BACKWARD_SHARE)  # the forward's share
                during_backward.start(left, set_end)
                fields = left.fields
            tb = time.perf_counter()
            loss.backward()
            value = float(loss.detach())
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            if during_backward is not None:
                during_backward.finish()  # shares of parameters that got no gradient
            # the real backward's time (what the next step's set time counts as spent), not the set time's
            slot.backward_s = time.perf_counter() - tb - (during_backward.spent_s if during_backward else 0.0)
            if during_backward is None:
                fields = ctx.finish_compute(wl, t0)
            sp.set(loss=round(value, 6), **fields)
        ctx.last_loss = value
        return value

    def want_stop(self) -> bool:
        return self.ctx.wall_exceeded() or (self.evaluator is not None and self.evaluator.done.is_set())

    def applied(self, slot: ExpertSlot, t: int) -> None:
        """Bookkeeping after an update of ``slot`` made from step ``t``'s gradient."""
        slot.updates += 1
        samples = (t + 1) * self.world * self.ctx.workload.batch_size
        if self.evaluator is not None and self.cadence.due(slot.updates, samples):
            # on the samples cadence the whole model is evaluated (every expert as it is now), as
            # every other scheme's snapshot is; only one thread ever applies updates, so no expert
            # changes while the others are copied
            due = self.slots if self.cadence.every_samples is not None else [slot]
            for s in due:
                self.evaluator.submit(s.index, t + 1, s.updates, s.flat.params, samples=samples)

    # -- PGCS / sequential ----------------------------------------------------------------------
    def _sync_apply(self, slot: ExpertSlot, t: int, buf: torch.Tensor, rec: Recorder) -> bool:
        """Sum, average and apply one expert's gradient; returns the stop flag (runs on the comm thread)."""
        n = slot.n
        self.sync(buf, rec, t, expert=slot.index)
        stop = bool(buf[n] > 0)
        buf[:n].div_(self.world)
        slot.unstage()
        with rec.span("apply", step=t, expert=slot.index, updates=slot.updates + 1):
            slot.opt.step()
        self.applied(slot, t)
        return stop

    def run_experts(self, overlap: bool) -> None:
        E = self.E
        last: dict[int, Ticket] = {}  # expert -> its latest sync
        order: list[int] = []  # experts in the order of their outstanding syncs
        t = 0
        while not self.ctx.steps_done(t):
            k = t % E
            slot = self.slots[k]
            prev = last.get(k)
            if prev is not None and wait_ticket(prev, self.rec, t, expert=k, what="expert_sync"):
                break  # sync t-E carried a stop vote: every worker stops here
            self.compute(slot, t, vote=self.want_stop())
            buf = slot.sync_buffer()
            if overlap:
                assert self.comm is not None and self.comm_rec is not None
                last[k] = self.comm.submit(lambda s=slot, tt=t, b=buf, r=self.comm_rec: self._sync_apply(s, tt, b, r))
            else:
                last[k] = Ticket.completed(self._sync_apply(slot, t, buf, self.rec))
            order.append(k)
            t += 1
        self.steps = t
        for k in order[-E:]:
            wait_ticket(last[k], self.rec, t, expert=k, what="drain")

    # -- DDP-style buckets ------------------------------------------------------------------------
    def run_buckets(self, buckets: int) -> None:
        assert self.comm is not None and self.comm_rec is not None
        comm, crec = self.comm, self.comm_rec
        plans = [make_buckets(s.flat, buckets) for s in self.slots]
        bucket_of = [{i: b for b, (_, _, members) in enumerate(bs) for i in members} for bs in plans]
        state: dict[str, Any] = {}

        def submit(b: int) -> None:
            slot, t = state["slot"], state["t"]
            lo, hi, _ = plans[slot.index][b]
            hi = hi + 1 if hi == slot.n else hi  # the bucket ending the gradient carries the stop flag
            buf = slot.sync_buffer(lo, hi)

            def job() -> None:
                self.sync(buf, crec, t, expert=slot.index, bucket=b)
                slot.unstage(lo, hi)

            state["submitted"][b] = True
            state["tickets"].append(comm.submit(job))

        sizes = [[p.numel() for p in s.flat.plist] for s in self.slots]
        backward = BackwardTime()

        def on_grad(k: int, i: int) -> None:
            if state.get("slot") is None or state["slot"].index != k:
                return
            backward.spend(sizes[k][i] / self.slots[k].n)  # this gradient's share of backward, then it is ready
            b = bucket_of[k][i]
            state["left"][b] -= 1
            if state["left"][b] == 0:
                submit(b)

        handles = []
        for k, slot in enumerate(self.slots):
            for i, p in enumerate(slot.flat.plist):
                handles.append(p.register_post_accumulate_grad_hook(lambda _p, k=k, i=i: on_grad(k, i)))
        try:
            t = 0
            while not self.ctx.steps_done(t):
                k = t % self.E
                slot = self.slots[k]
                bs = plans[k]
                state.update(slot=slot, t=t, tickets=[], submitted=[False] * len(bs),
                             left=[len(m) for _, _, m in bs])
                self.compute(slot, t, during_backward=backward, vote=self.want_stop())
                for b in range(len(bs)):  # parameters that got no gradient this step
                    if not state["submitted"][b]:
                        submit(b)
                tickets = state["tickets"]
                state["slot"] = None
                if not all(tk.done() for tk in tickets):
                    start = self.rec.now_ns()
                    for tk in tickets:
                        tk.wait()
                    self.rec.emit("wait", start, self.rec.now_ns() - start, step=t, expert=k, what="bucket_sync")
                for tk in tickets:
                    tk.wait()  # re-raise a failed bucket
                n = slot.n
                stop = bool(slot.flat.grad_buf[n] > 0)
                slot.flat.grad_buf[:n].div_(self.world)
                with self.rec.span("apply", step=t, expert=k, updates=slot.updates + 1):
                    slot.opt.step()
                self.applied(slot, t)
                t += 1
                if stop:
                    break
            self.steps = t
        finally:
            for h in handles:
                h.remove()


def run(ctx: WorkerContext) -> int:
    """Worker loop of ``pgcs`` (overlap or sequential) and ``ddp_overlap``; see the module doc."""
    job, tc = ctx.job, ctx.job.training
    p = tc.scheme.params
    count = p.expert_count(tc.workload.name, tc.workload.params)
    plan = None
    if p.sync == "blp":
        plan = p.load_plan("training.scheme")
        if plan is None:
            raise ValidationError("training.scheme.plan", "sync: blp but no BLP plan was given",
                                  "put the plan (testbed blp-plan --json) in plan or its path in plan_file")
    slots = build_experts(ctx, count)
    evaluator = None
    if job.rank == 0:
        evaluator = ExpertEvaluator([s.workload for s in slots], ctx.rec, Path(job.out_dir) / "metrics.csv",
                                    tc.stop.target, ctx.device, give_up=tc.stop.give_up)
        for s in slots:
            evaluator.submit(s.index, 0, 0, s.flat.params, wall_s=0.0, samples=0)
    buckets = p.overlap_kind == "buckets"
    overlap = buckets or p.overlap
    comm = comm_rec = None
    ok = False
    try:
        tdist.init_world(job, ctx.rec)
        sync = GradSync(job, p.sync, plan)
        if overlap:
            comm_rec = comm_recorder(job, ctx.rec)
            comm = CommThread(f"{tc.scheme.name}-comm")
        trainer = _Trainer(ctx, slots, sync, evaluator, comm, comm_rec)
        ctx.start()  # the start barrier: PGCS computes outside ctx.compute
        if buckets:
            trainer.run_buckets(p.buckets)
        else:
            trainer.run_experts(overlap)
        if evaluator is not None:
            for s in slots:
                evaluator.final(s.index, trainer.steps, s.updates, s.flat.params)
        if tc.save_model:
            save_model(job, torch.cat([s.flat.params.detach().cpu() for s in slots]))
        ok = True
    finally:
        if comm is not None:
            comm.close(30.0 if ok else 2.0)
        if comm_rec is not None:
            comm_rec.close()
        if evaluator is not None:
            evaluator.close()
        tdist.close_world()
    return 0
