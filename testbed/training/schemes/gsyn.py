"""Gsyn workers (our reading; see ``schemes.params`` and docs/DESIGN.md "Training model").

Per group step ``k`` (groups from the job, leader = first member):

1. every member computes the gradient of its shard of global step ``k``
   on the group's current model (``compute``);
2. ring all-reduce inside the group (``intra_sync``, or ``wan_sync`` when an
   explicit group spans DCs) - the leader then holds the group average;
3. the leader pushes it to the server tagged with the version the group
   computed on, the server applies it at once and returns its current
   model (``push``/``pull``, see ``psclient``);
4. the leader broadcasts model + version + stop flag to its members
   (``intra_sync``, or ``wan_sync`` with ``wan_bytes``/``wan_to`` for the copies
   sent to other DCs; ``collectives.GroupBroadcast``: a gloo broadcast, one copy
   per other DC for a group spanning DCs).

Members never decide to stop on their own clock: the leader's stop flag
(its step budget, wall-clock limit, or the server's stop) travels in the
broadcast, so a group always ends together.  G = 1 is BSP through the
server; with singleton groups (G = N) no process group is created and
every worker is an ASP client.
"""

from __future__ import annotations

from testbed.training import dist as tdist
from testbed.training.collectives import GroupBroadcast, ring_allreduce
from testbed.training.psclient import PSClient
from testbed.training.runtime import WorkerContext, save_model


def run(ctx: WorkerContext) -> int:
    job, tc, flat = ctx.job, ctx.job.training, ctx.flat
    groups = job.groups or []
    g = job.group
    assert g is not None and job.server_addr is not None and job.server_port is not None
    members = groups[g]
    leader = members[0]
    is_leader = job.rank == leader
    n = flat.n
    need_world = any(len(m) > 1 for m in groups)
    if need_world:
        tdist.init_world(job, ctx.rec)
    try:
        pgs = tdist.make_subgroups(groups, tc.comm_timeout_s) if need_world else [None] * len(groups)
        pg = pgs[g]
        bcast = GroupBroadcast(job.peers, groups, tc.comm_timeout_s) if need_world else None
        ring = tdist.ring_order(job.peers, members)
        phase = tdist.sync_phase(job.peers, members)
        client = None
        pbuf = ctx.params_out()  # params + [version, stop]
        if is_leader:
            client = PSClient(job.server_addr, job.server_port, g, ctx.rec, source_addr=job.address,
                              connect_timeout_s=tc.connect_timeout_s, timeout_s=tc.comm_timeout_s, name="ps",
                              extra={"group": g}, wan_dc=job.server_dc if job.server_dc not in (None, job.dc) else None)
            reply = client.hello()
            pbuf[:n].copy_(reply.params[:n])
            pbuf[n], pbuf[n + 1] = float(reply.version), float(reply.stop)
        if bcast is not None and len(members) > 1:
            with ctx.rec.span(phase, step=None, op="broadcast", peer=job.peers[leader].host, group=g) as sp:
                sent, wan_to = bcast(pbuf, g, job.rank)
                sp.set(bytes=sent, **tdist.wan_fields(wan_to))
        ctx.params_in(pbuf)
        version, stop = int(pbuf[n]), bool(pbuf[n + 1])
        step = 0
        try:
            while not stop and not ctx.steps_done(step):
                ctx.compute(step, shard=job.rank, num_shards=job.world_size, version=version, group=g)
                gbuf = ctx.grads_out()
                with ctx.rec.span(phase, step=step, op="ring_allreduce", peers=len(members), group=g) as sp:
                    sent = ring_allreduce(gbuf, ring, pg)
                    sp.set(bytes=sent, **tdist.wan_fields(tdist.ring_wan_to(sent, ring, job.rank, job.peers)))
                pbuf = ctx.params_out()
                if is_leader:
                    assert client is not None
                    gbuf.div_(len(members))
                    last = ctx.is_last(step)
                    # the whole buffer when padded (training.compute.pad_gradient)
                    reply = client.push(step, version, gbuf if ctx.pad else gbuf[:n], last=last)
                    pbuf[:n].copy_(reply.params[:n])
                    pbuf[n], pbuf[n + 1] = float(reply.version), float(reply.stop or last)
                if bcast is not None and len(members) > 1:
                    with ctx.rec.span(phase, step=step, op="broadcast", peer=job.peers[leader].host,
                                      group=g) as sp:  # a group spanning DCs broadcasts over the WAN
                        sent, wan_to = bcast(pbuf, g, job.rank)
                        sp.set(bytes=sent, **tdist.wan_fields(wan_to))
                ctx.params_in(pbuf)
                version, stop = int(pbuf[n]), bool(pbuf[n + 1])
                step += 1
        finally:
            if client is not None:
                client.bye()
        if tc.save_model:
            save_model(job, flat.params)
    finally:
        if need_world:
            tdist.close_world()
    return 0
