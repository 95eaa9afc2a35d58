"""ASP and SSP workers: compute on the model last pulled, push, take the model the server returns.

Worker ``r`` at its step ``k`` trains on shard ``r`` of global step ``k``
(the shared sharding rule), so what it computes depends only on the model
version it holds, never on timing: a run can be replayed from the server's
log of (client, step, version) updates.  The SSP bound is enforced by the
server holding the reply (see ``server``); the worker records that time as
``wait``.  The last push is marked so the server neither holds it nor
waits for this worker afterwards.
"""

from __future__ import annotations

from testbed.training.psclient import PSClient
from testbed.training.runtime import WorkerContext, save_model


def run(ctx: WorkerContext) -> int:
    job, tc, flat = ctx.job, ctx.job.training, ctx.flat
    assert job.server_addr is not None and job.server_port is not None
    client = PSClient(job.server_addr, job.server_port, job.rank, ctx.rec, source_addr=job.address,
                      connect_timeout_s=tc.connect_timeout_s, timeout_s=tc.comm_timeout_s, name="ps",
                      wan_dc=job.server_dc if job.server_dc not in (None, job.dc) else None)
    reply = client.hello()
    ctx.params_in(reply.params[: flat.n])
    version = reply.version
    step = 0
    try:
        while not reply.stop and not ctx.steps_done(step):
            ctx.compute(step, shard=job.rank, num_shards=job.world_size, version=version, clock=step)
            last = ctx.is_last(step)
            # the whole buffer when padded (training.compute.pad_gradient): the profiled model's size
            grads = ctx.grads_out() if ctx.pad else ctx.grads_out()[: flat.n]
            reply = client.push(step, version, grads, last=last)
            ctx.params_in(reply.params[: flat.n])
            version = reply.version
            step += 1
            if last:
                break
    finally:
        client.bye()
    if tc.save_model:
        save_model(job, flat.params)
    return 0
