"""``localsgd``: every worker steps on its own shard; every ``every`` steps the models are averaged.

The loop uses only the WorkerContext API every built-in scheme uses: ``compute``
(a recorded ``compute`` span), the flat parameter buffer with its control slots
(``params_out``/``params_in``), the ring all-reduce of ``collectives`` and a
recorded sync span, so the timeline, the breakdown and the WAN byte accounting
of the report work unchanged.  Rank 0 evaluates the averaged model.
"""

from __future__ import annotations

from pathlib import Path

from testbed.training import dist as tdist
from testbed.training.collectives import ring_allreduce
from testbed.training.evaluator import Evaluator
from testbed.training.flat import make_optimizer
from testbed.training.lr import resolve_job
from testbed.training.runtime import WorkerContext, save_model


def run(ctx: WorkerContext) -> int:
    job, tc, flat = ctx.job, ctx.job.training, ctx.flat
    every, n, world = tc.scheme.params.every, flat.n, job.world_size
    opt = make_optimizer(tc.optimizer, flat.plist, lr=resolve_job(job).for_client())  # lr rule applied
    ring = tdist.ring_order(job.peers, list(range(world)))
    phase = tdist.sync_phase(job.peers, list(range(world)))
    evaluator = None
    if job.rank == 0:
        evaluator = Evaluator(ctx.workload, ctx.rec, Path(job.out_dir) / "metrics.csv", tc.stop.target, ctx.device)
        evaluator.submit(0, 0, flat.params, wall_s=0.0)  # the initial model: time 0 of the training clock
    tdist.init_world(job, ctx.rec)
    try:
        step = 0
        while not ctx.steps_done(step):
            ctx.compute(step, shard=job.rank, num_shards=world)
            with ctx.rec.span("apply", step=step):
                opt.step()
            step += 1
            if step % every and not ctx.steps_done(step):
                continue
            buf = ctx.params_out()  # parameters + [version, stop]
            buf[n] = 0.0
            buf[n + 1] = 1.0 if ctx.wall_exceeded() else 0.0  # any rank out of time stops all, same round
            with ctx.rec.span(phase, step=step - 1, op="ring_allreduce", peers=world) as sp:
                sent = ring_allreduce(buf, ring)
                sp.set(bytes=sent, **tdist.wan_fields(tdist.ring_wan_to(sent, ring, job.rank, job.peers)))
            stop = bool(buf[n + 1] > 0)
            buf[:n].div_(world)
            ctx.params_in(buf)
            if evaluator is not None:
                evaluator.submit(step, step // every, flat.params)
            if stop:
                break
        if evaluator is not None:
            evaluator.final(step, step // every, flat.params)
        if tc.save_model:
            save_model(job, flat.params)
    finally:
        if evaluator is not None:
            evaluator.close()
        tdist.close_world()
    return 0
