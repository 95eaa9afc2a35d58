"""torch.distributed set-up for workers: the gloo world, subgroups, ring order.

The world holds the N workers only (the parameter server talks TCP, see
``wire``).  Rendezvous is a TCP store on rank 0's address and the job's
rendezvous port; gloo's own connections use the interface named by
``GLOO_SOCKET_IFNAME`` (set from the job by ``runtime.setup_process``), so
all of it crosses the emulated network.  ``new_group`` is collective over
the whole world: every rank creates every subgroup, in the same order.

``training.backend: nccl`` makes the world ``cpu:gloo,cuda:nccl``: collectives
on CUDA tensors (the flat gradient and parameter buffers, which the worker
context then hands out on the device) run on NCCL, everything on CPU tensors
(barriers, BLP's point-to-point executor) stays on gloo.  NCCL is forced onto
the emulated interface by :func:`nccl_env`, so every byte it moves crosses the
shaped links and the spans' byte counts stay exact.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from testbed.collect.recorder import Recorder
from testbed.training.jobs import Job, Peer


def nccl_env(ifname: str | None, host: str) -> dict[str, str]:
    """NCCL's environment for one worker: sockets on the emulated interface, nothing else.

    * ``NCCL_SOCKET_IFNAME``: the host's emulated interface (the bootstrap and
      every data connection), ``NCCL_NET=Socket`` and ``NCCL_IB_DISABLE``: no
      InfiniBand/RoCE verbs, which would bypass the kernel's shaping.
    * ``NCCL_P2P_DISABLE``, ``NCCL_SHM_DISABLE``, ``NCCL_NVLS_ENABLE=0``,
      ``NCCL_COLLNET_ENABLE=0``: no NVLink/PCIe peer copies, shared memory or
      switch offload between ranks on one machine.
    * ``NCCL_HOSTID``: the emulated host's name, so NCCL sees every host as
      its own node (process hosts share the machine's hostname and boot id,
      from which NCCL would otherwise conclude they are one node).
    * ``NCCL_ALGO=Ring``, ``NCCL_PROTO=Simple``: the ring the spans count
      (``2 (n-1)/n * S`` per rank) and payload-sized messages (the LL
      protocols send a flag word beside every data word).
    """
    env = {
        "NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
        "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0", "NCCL_HOSTID": host,
        "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple",
    }
    if ifname:
        env["NCCL_SOCKET_IFNAME"] = ifname
    return env


def backend_of(job: Job) -> str:
    """The ``init_process_group`` backend string of the job's world."""
    return "cpu:gloo,cuda:nccl" if job.training.backend == "nccl" else "gloo"


def init_world(job: Job, rec: Recorder) -> None:
    """The gloo world of the workers, rendezvous through the trial's store (``start.store_for``),
    which the start barrier shares, so the parameter server can meet the workers there too."""
    from testbed.training.start import store_for

    with rec.span("wait", what="rendezvous", peer=f"{job.rendezvous_addr}:{job.rendezvous_port}"):
        dist.init_process_group(
            backend_of(job),
            store=dist.PrefixStore("gloo/", store_for(job)),
            rank=job.rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=job.training.comm_timeout_s),
        )


def close_world() -> None:
    """Tear the world down on success; skipped while an exception propagates (called from a
    ``finally``), because destroying a group whose peers are mid-collective can block, and
    the failing process is about to exit anyway."""
    if sys.exc_info()[0] is not None:
        return
    if dist.is_initialized():
        dist.destroy_process_group()


def make_subgroups(groups: Sequence[Sequence[int]], timeout_s: float) -> list[object | None]:
    """One process group per rank list (None for singletons); called identically on every rank."""
    out: list[object | None] = []
    for ranks in groups:
        if len(ranks) > 1:
            out.append(dist.new_group(sorted(ranks), timeout=timedelta(seconds=timeout_s)))
        else:
            out.append(None)
    # Every rank waits until every group exists: rank 0 hosts the rendezvous store, and a
    # group that finishes early (Gsyn groups run independently) must not tear the store
    # down while a slow-starting rank elsewhere is still creating its own group.
    dist.barrier()
    return out


def dc_order(peers: Sequence[Peer]) -> list[str]:
    """DC names in order of first appearance among the ranks."""
    seen: list[str] = []
    for p in peers:
        if p.dc not in seen:
            seen.append(p.dc)
    return seen


def ring_order(peers: Sequence[Peer], ranks: Sequence[int]) -> list[int]:
    """``ranks`` sorted by (DC order, rank): the ring crosses each DC boundary once per direction."""
    order = dc_order(peers)
    return sorted(ranks, key=lambda r: (order.index(peers[r].dc), r))


def ranks_by_dc(peers: Sequence[Peer]) -> list[list[int]]:
    return [[p.rank for p in peers if p.dc == dc] for dc in dc_order(peers)]


def ring_wan_bytes(sent: int, ring: Sequence[int], rank: int, peers: Sequence[Peer]) -> int:
    """Bytes of a ring step that crossed DCs: a ring rank sends only to its successor."""
    if rank not in ring or len(ring) < 2:
        return 0
    nxt = ring[(ring.index(rank) + 1) % len(ring)]
    return sent if peers[nxt].dc != peers[rank].dc else 0


def ring_wan_to(sent: int, ring: Sequence[int], rank: int, peers: Sequence[Peer]) -> dict[str, int]:
    """Like :func:`ring_wan_bytes`, by destination DC: ``{successor's DC: sent}`` if it is another DC."""
    wan = ring_wan_bytes(sent, ring, rank, peers)
    return {peers[ring[(ring.index(rank) + 1) % len(ring)]].dc: wan} if wan else {}


def wan_fields(wan_to: dict[str, int]) -> dict[str, object]:
    """Span keys of the bytes a span sent across DCs: ``wan_bytes`` (total) and ``wan_to`` (per destination DC).

    ``wan_to`` lets a check route every byte over the topology (a relayed
    flow loads every link of its path) and compare with each link's counter.
    """
    return {"wan_bytes": int(sum(wan_to.values())), "wan_to": {k: int(v) for k, v in wan_to.items() if v}}


def sync_phase(peers: Sequence[Peer], ranks: Sequence[int]) -> str:
    """``intra_sync`` when all ranks are in one DC, else ``wan_sync``."""
    return "intra_sync" if len({peers[r].dc for r in ranks}) <= 1 else "wan_sync"
