"""BSP: every step, all workers average their gradients and apply the same update.

Each worker holds a full replica and its own optimizer; since the averaged
gradient is bit-identical on every rank (see ``collectives``), replicas
stay identical, and with the shared sharding rule the run equals one
process training on the concatenated batch.

``allreduce: ring`` - one ring over all workers (ordered by DC).
``allreduce: hierarchical`` - reduce to each DC's leader (first rank of the
DC), ring all-reduce among the DC leaders, broadcast in each DC, all three
gloo collectives (``collectives.HierarchicalAllReduce``).

Stopping: the gradient buffer carries one extra slot; a rank that wants to
stop (wall-clock limit; rank 0 also when the evaluator met the target)
puts 1 there, so after the all-reduce every rank knows, in the same step,
without an extra round trip.  Rank 0 evaluates (background thread) on the
trial's cadence (``evaluator.EvalCadence``: every ``eval_every_samples``
samples, a step being N x batch, or every ``eval_every`` steps) and writes
``metrics.csv``.
"""

from __future__ import annotations

from pathlib import Path

from testbed.training import dist as tdist
from testbed.training.collectives import HierarchicalAllReduce, ring_allreduce
from testbed.training.evaluator import EvalCadence, Evaluator
from testbed.training.flat import make_optimizer
from testbed.training.lr import resolve_job
from testbed.training.runtime import WorkerContext, save_model


class _Sync:
    """The all-reduce of one scheme configuration, recorded as spans."""

    def __init__(self, ctx: WorkerContext, mode: str) -> None:
        job = ctx.job
        self.ctx, self.mode, self.rank = ctx, mode, job.rank
        peers, everyone = job.peers, list(range(job.world_size))
        self.ring = tdist.ring_order(peers, everyone)
        self.ring_phase = tdist.sync_phase(peers, everyone)
        self.hier = HierarchicalAllReduce(peers, job.rank, job.training.comm_timeout_s) \
            if mode == "hierarchical" else None

    def __call__(self, buf, step: int) -> None:  # noqa: ANN001 - torch tensor
        rec = self.ctx.rec
        if self.hier is not None:
            self.hier(buf, rec, step)
            return
        with rec.span(self.ring_phase, step=step, op="ring_allreduce", peers=len(self.ring)) as sp:
            sent = ring_allreduce(buf, self.ring)
            sp.set(bytes=sent, **tdist.wan_fields(tdist.ring_wan_to(sent, self.ring, self.rank, self.ctx.job.peers)))


def run(ctx: WorkerContext) -> int:
    job, tc, flat = ctx.job, ctx.job.training, ctx.flat
    n, world = flat.n, job.world_size
    lr = resolve_job(job).for_client()  # the scheme's lr rule (testbed.training.lr)
    opt = make_optimizer(tc.optimizer, flat.plist, lr=lr)
    evaluator = None
    cadence, per_step = EvalCadence(tc), world * ctx.workload.batch_size
    if job.rank == 0:
        evaluator = Evaluator(ctx.workload, ctx.rec, Path(job.out_dir) / "metrics.csv", tc.stop.target, ctx.device,
                              give_up=tc.stop.give_up)
        evaluator.submit(0, 0, flat.params, wall_s=0.0, samples=0)  # the initial model: time 0 of the clock
    tdist.init_world(job, ctx.rec)
    try:
        sync = _Sync(ctx, tc.scheme.params.allreduce)
        step = 0
        while not ctx.steps_done(step):
            ctx.compute(step, shard=job.rank, num_shards=world)
            buf = ctx.grads_out()
            want_stop = ctx.wall_exceeded() or (evaluator is not None and evaluator.done.is_set())
            buf[n] = 1.0 if want_stop else 0.0
            sync(buf, step)
            stop = bool(buf[n] > 0)
            buf.div_(world)
            ctx.grads_in(buf)
            with ctx.rec.span("apply", step=step, version=step, lr=lr):
                opt.step()
            step += 1
            if evaluator is not None and cadence.due(step, step * per_step):
                evaluator.submit(step, step, flat.params, samples=step * per_step)
            if stop:
                break
        if evaluator is not None:
            evaluator.final(step, step, flat.params, samples=step * per_step)
        if tc.save_model:
            save_model(job, flat.params)
    finally:
        if evaluator is not None:
            evaluator.close()
        tdist.close_world()
    return 0
