"""The trial's start barrier: the zero of the training clock, the same for every scheme.

Why: a trial's processes start one after another (on two shared cores,
six torch processes take seconds to import and build their models), and a
parameter server that is still loading while the first worker already
computes would charge a scheme for its start-up.  So every process of a
trial - every worker and the parameter server - meets here once it is
ready (world initialised, subgroups built, first model pulled), and the
training clock starts at the release: metrics rows (``wall_s``),
time-to-target and the ``stop.wall_s`` rule count from it.  Spans keep
``ts`` since the runner's t0, so start-up stays visible in the trace.

How: a key-value store (``torch.distributed.TCPStore``) hosted by worker
rank 0 at the job's rendezvous address and port; the same store carries the
gloo world's rendezvous (under the prefix ``gloo/``), so the barrier needs
no port of its own.  Each process adds one to ``start/arrived``; the one
that makes the count complete writes the release time (ns since t0, on its
recorder's clock: the hosts of one machine share one kernel clock) and
everyone waits for that key.  Rank 0 keeps the store open until every
process has read the release time.  The wait is recorded as a ``wait`` span
with ``what: start_barrier`` and ``start_ns``, the release time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from testbed.collect.recorder import Recorder
from testbed.training.jobs import Job

ARRIVED = "start/arrived"
RELEASE = "start/release_ns"


def processes(job: Job) -> int:
    """How many processes the barrier waits for: the workers, plus the server if the trial has one."""
    return job.world_size + (1 if job.server_addr is not None else 0)


_STORE: dict[tuple[str, int], Any] = {}


def store_for(job: Job) -> Any:
    """This process's connection to the trial's store, opened once (the world and the barrier share it)."""
    key = (job.rendezvous_addr, job.rendezvous_port)
    if key not in _STORE:
        _STORE[key] = open_store(job)
    return _STORE[key]


def open_store(job: Job) -> Any:
    """The trial's store: rank 0 hosts it, every other process (the server included) connects.

    A client retries the connection until ``connect_timeout_s`` (rank 0 may
    still be importing torch).
    """
    import torch.distributed as dist

    master = job.role == "worker" and job.rank == 0
    return dist.TCPStore(job.rendezvous_addr, job.rendezvous_port, None, master,
                         timedelta(seconds=job.training.connect_timeout_s if not master
                                   else job.training.comm_timeout_s), wait_for_workers=False)


class StartTimeout(RuntimeError):
    """Not every process reached the start barrier in time (the message says how many did)."""


def meet(job: Job, store: Any, rec: Recorder) -> int:
    """Wait at the barrier; returns the release time (ns since t0) and sets the recorder's start."""
    total = processes(job)
    arrive = rec.now_ns()
    if int(store.add(ARRIVED, 1)) == total:
        store.set(RELEASE, str(rec.now_ns()))
    timeout = timedelta(seconds=job.training.comm_timeout_s)
    try:
        store.wait([RELEASE], timeout)
    except Exception as exc:  # torch raises DistStoreError (a RuntimeError) on timeout
        arrived = int(store.add(ARRIVED, 0))
        raise StartTimeout(f"start barrier: {arrived} of {total} processes arrived within "
                           f"{job.training.comm_timeout_s:g} s (training.comm_timeout_s); see the logs of "
                           f"the missing ones") from exc
    start = int(store.get(RELEASE))
    store.set(f"start/read/{job.rank}", "1")
    rec.emit("wait", arrive, rec.now_ns() - arrive, what="start_barrier", start_ns=start, processes=total)
    rec.set_start(start)
    if job.role == "worker" and job.rank == 0:  # the host of the store: stay until everyone has read it
        store.wait([f"start/read/{r}" for r in range(total)], timeout)
    return start
