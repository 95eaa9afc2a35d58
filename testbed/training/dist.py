"""torch.distributed set-up for workers: the gloo world, subgroups, ring order.

The world holds the N workers only (the parameter server talks TCP, see
``wire``).  Rendezvous is a TCP store on rank 0's address and the job's
rendezvous port; gloo's own connections use the interface named by
``GLOO_SOCKET_IFNAME`` (set from the job by ``runtime.setup_process``), so
all of it crosses the emulated network.  ``new_group`` is collective over
the whole world: every rank creates every subgroup, in the same order.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from testbed.collect.recorder import Recorder
from testbed.training.jobs import Job, Peer


def init_world(job: Job, rec: Recorder) -> None:
    """The gloo world of the workers, rendezvous through the trial's store (``start.store_for``),
    which the start barrier shares, so the parameter server can meet the workers there too."""
    from testbed.training.start import store_for

    with rec.span("wait", what="rendezvous", peer=f"{job.rendezvous_addr}:{job.rendezvous_port}"):
        dist.init_process_group(
            "gloo",
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
