"""BSP: every step, all workers average their gradients and apply the same update.

Each worker holds a full replica and its own optimizer; since the averaged
gradient is bit-identical on every rank (see ``collectives``), replicas
stay identical, and with the shared sharding rule the run equals one
process training on the concatenated batch.

``allreduce: ring`` - one ring over all workers (ordered by DC).
``allreduce: hierarchical`` - star reduce to each DC's leader (first rank of
the DC), ring all-reduce among the DC leaders, star broadcast in each DC.

Stopping: the gradient buffer carries one extra slot; a rank that wants to
stop (wall-clock limit; rank 0 also when the evaluator met the target)
puts 1 there, so after the all-reduce every rank knows, in the same step,
without an extra round trip.  Rank 0 evaluates (background thread) every
``eval_every`` steps and writes ``metrics.csv``.
"""

from __future__ import annotations

from pathlib import Path

from testbed.training import dist as tdist
from testbed.training.collectives import StarReducer, ring_allreduce, star_broadcast
from testbed.training.evaluator import Evaluator
from testbed.training.flat import make_optimizer
from testbed.training.runtime import WorkerContext, save_model


class _Sync:
    """The all-reduce of one scheme configuration, recorded as spans."""

    def __init__(self, ctx: WorkerContext, mode: str) -> None:
        job = ctx.job
        self.ctx, self.mode, self.rank = ctx, mode, job.rank
        peers, everyone = job.peers, list(range(job.world_size))
        self.ring = tdist.ring_order(peers, everyone)
        self.ring_phase = tdist.sync_phase(peers, everyone)
        if mode == "hierarchical":
            self.dcs = tdist.ranks_by_dc(peers)
            self.leaders = [m[0] for m in self.dcs]
            timeout = job.training.comm_timeout_s
            self.dc_groups = tdist.make_subgroups(self.dcs, timeout)
            self.leader_group = tdist.make_subgroups([self.leaders], timeout)[0]
            self.my_dc = next(i for i, m in enumerate(self.dcs) if self.rank in m)
            self.reduce = StarReducer()

    def __call__(self, buf, step: int) -> None:  # noqa: ANN001 - torch tensor
        rec = self.ctx.rec
        if self.mode == "ring":
            with rec.span(self.ring_phase, step=step, op="ring_allreduce", peers=len(self.ring)) as sp:
                sent = ring_allreduce(buf, self.ring)
                sp.set(bytes=sent, wan_bytes=tdist.ring_wan_bytes(sent, self.ring, self.rank, self.ctx.job.peers))
            return
        members, leader = self.dcs[self.my_dc], self.dcs[self.my_dc][0]
        group = self.dc_groups[self.my_dc]
        with rec.span("intra_sync", step=step, op="reduce", peer=leader) as sp:
            sp["bytes"] = self.reduce(buf, leader, members, group)
        if self.rank == leader and len(self.leaders) > 1:
            with rec.span("wan_sync", step=step, op="ring_allreduce", peers=len(self.leaders)) as sp:
                sp["bytes"] = sp["wan_bytes"] = ring_allreduce(buf, self.leaders, self.leader_group)
        with rec.span("intra_sync", step=step, op="broadcast", peer=leader) as sp:
            sp["bytes"] = star_broadcast(buf, leader, members, group)


def run(ctx: WorkerContext) -> int:
    job, tc, flat = ctx.job, ctx.job.training, ctx.flat
    n, world = flat.n, job.world_size
    opt = make_optimizer(tc.optimizer, flat.plist)
    evaluator = None
    if job.rank == 0:
        evaluator = Evaluator(ctx.workload, ctx.rec, Path(job.out_dir) / "metrics.csv", tc.stop.target, ctx.device)
        evaluator.submit(0, 0, flat.params)
    tdist.init_world(job, ctx.rec)
    try:
        sync = _Sync(ctx, tc.scheme.params.allreduce)
        step = 0
        while not ctx.steps_done(step):
            ctx.compute(step, shard=job.rank, num_shards=world)
            buf = ctx.grads_out()
            want_stop = ctx.wall_exceeded() or (evaluator is not None and evaluator.reached.is_set())
            buf[n] = 1.0 if want_stop else 0.0
            sync(buf, step)
            stop = bool(buf[n] > 0)
            buf.div_(world)
            ctx.grads_in(buf)
            with ctx.rec.span("apply", step=step, version=step):
                opt.step()
            step += 1
            if evaluator is not None and step % tc.eval_every == 0:
                evaluator.submit(step, step, flat.params)
            if stop:
                break
        if evaluator is not None:
            evaluator.final(step, step, flat.params)
        if tc.save_model:
            save_model(job, flat.params)
    finally:
        if evaluator is not None:
            evaluator.close()
        tdist.close_world()
    return 0
