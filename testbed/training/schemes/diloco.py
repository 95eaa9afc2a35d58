"""DiLoCo workers: H inner steps on the local shard, then one outer step shared by all.

Round ``j`` (the outer step) of every worker:

1. from the global model ``theta``, ``inner_steps`` steps of the inner optimizer (the
   training's ``optimizer``, whose state each worker keeps across rounds) on its shard of
   global steps ``jH .. jH+H-1`` (the shared sharding rule): ``compute`` + ``apply`` spans;
2. the outer gradient ``theta - theta_local`` is summed over all workers by one ring
   all-reduce (``wan_sync``/``intra_sync``, ``what: outer``, ring ordered by DC as BSP's)
   and divided by the world size;
3. every worker applies the same outer step to ``theta`` (SGD, Nesterov momentum, as
   ``torch.optim.SGD(nesterov=True)`` computes it: ``v = mu v + g; theta -= lr (g + mu v)``)
   and continues from it, so all replicas hold the identical global model after a round.

The all-reduce buffer carries a stop slot (wall-clock limit, or rank 0's evaluator reached
the target), so all workers stop in the same round.  The last round may be shorter than H
(the step budget is not a multiple).  Rank 0 evaluates the global model after each round
in which a multiple of ``eval_every_samples`` samples (a step being N x batch) or, without
it, of ``eval_every`` steps was passed; ``updates`` counts outer steps.  (The global model
only changes at a round, so the cadence cannot be finer than H steps.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from testbed.training import dist as tdist
from testbed.training.collectives import ring_allreduce
from testbed.training.evaluator import EvalCadence, Evaluator
from testbed.training.flat import make_optimizer
from testbed.training.lr import resolve_job
from testbed.training.runtime import WorkerContext, save_model


def outer_step(theta: torch.Tensor, grad: torch.Tensor, momentum: torch.Tensor | None, lr: float, mu: float,
               nesterov: bool) -> torch.Tensor | None:
    """One outer SGD step on ``theta`` in place; returns the momentum buffer (None without momentum)."""
    if mu > 0:
        momentum = grad.clone() if momentum is None else momentum.mul_(mu).add_(grad)
        grad = grad.add(momentum, alpha=mu) if nesterov else momentum
    theta.add_(grad, alpha=-lr)
    return momentum


def run(ctx: WorkerContext) -> int:
    job, tc, flat = ctx.job, ctx.job.training, ctx.flat
    p = tc.scheme.params
    n, world = flat.n, job.world_size
    lr = resolve_job(job).for_client()  # inner lr by the scheme's rule (testbed.training.lr); outer_lr as given
    inner = make_optimizer(tc.optimizer, flat.plist, lr=lr)
    ring = tdist.ring_order(job.peers, list(range(world)))
    phase = tdist.sync_phase(job.peers, list(range(world)))
    theta = flat.params.detach().clone()  # the global model (identical on every worker)
    momentum: torch.Tensor | None = None
    evaluator = None
    cadence, per_step = EvalCadence(tc), world * ctx.workload.batch_size
    if job.rank == 0:
        evaluator = Evaluator(ctx.workload, ctx.rec, Path(job.out_dir) / "metrics.csv", tc.stop.target, ctx.device,
                              give_up=tc.stop.give_up)
        evaluator.submit(0, 0, theta, wall_s=0.0, samples=0)
    tdist.init_world(job, ctx.rec)
    try:
        step, rounds = 0, 0
        while not ctx.steps_done(step):
            ctx.compute(step, shard=job.rank, num_shards=world, round=rounds)
            with ctx.rec.span("apply", step=step, what="inner", lr=lr):
                inner.step()
            step += 1
            if step % p.inner_steps and not ctx.steps_done(step):
                continue
            buf = ctx.params_out()  # local parameters + [version, stop]
            buf[:n].neg_().add_(theta.to(buf.device))  # outer gradient: theta - theta_local
            buf[n] = 0.0
            want_stop = ctx.wall_exceeded() or (evaluator is not None and evaluator.done.is_set())
            buf[n + 1] = 1.0 if want_stop else 0.0
            with ctx.rec.span(phase, step=step - 1, op="ring_allreduce", peers=world, what="outer",
                              round=rounds) as sp:
                sent = ring_allreduce(buf, ring)
                sp.set(bytes=sent, **tdist.wan_fields(tdist.ring_wan_to(sent, ring, job.rank, job.peers)))
            stop = bool(buf[n + 1] > 0)
            with ctx.rec.span("apply", step=step - 1, what="outer", round=rounds, version=rounds + 1):
                grad = buf[:n].div_(world).to(theta.device)
                momentum = outer_step(theta, grad, momentum, p.outer_lr, p.outer_momentum, p.nesterov)
                buf[:n].copy_(theta)
                ctx.params_in(buf)
            rounds += 1
            if evaluator is not None and cadence.due(step, step * per_step, crossing=True):
                evaluator.submit(step, rounds, theta, samples=step * per_step)
            if stop:
                break
        if evaluator is not None:
            evaluator.final(step, rounds, theta, samples=step * per_step)
        if tc.save_model:
            save_model(job, flat.params)
    finally:
        if evaluator is not None:
            evaluator.close()
        tdist.close_world()
    return 0
