"""Scheme registry: name -> (params dataclass, lazily imported worker loop).

A scheme's worker loop is ``run(ctx: WorkerContext) -> None``; schemes
whose params say ``uses_server`` also need the parameter-server process
(``python -m testbed.training.server``), which serves ``asp``, ``ssp`` and
``gsyn`` alike (the SSP clock bound and the client set differ).
"""

from __future__ import annotations

from testbed.training.registry import Registry
from testbed.training.schemes.params import (
    AspParams,
    BspParams,
    DilocoParams,
    GsynParams,
    SspParams,
)

SCHEMES = Registry("scheme")
SCHEMES.register("bsp", BspParams, "testbed.training.schemes.bsp:run",
                 "bulk-synchronous all-reduce (ring or hierarchical)")
SCHEMES.register("asp", AspParams, "testbed.training.schemes.ps_worker:run",
                 "asynchronous parameter server")
SCHEMES.register("ssp", SspParams, "testbed.training.schemes.ps_worker:run",
                 "stale-synchronous parameter server (staleness bound s)")
SCHEMES.register("diloco", DilocoParams, "testbed.training.schemes.diloco:run",
                 "DiLoCo local SGD: H inner steps per worker, outer Nesterov step on the averaged outer gradient")
SCHEMES.register("gsyn", GsynParams, "testbed.training.schemes.gsyn:run",
                 "BSP inside G groups, asynchronous parameter server between groups")
from testbed.training.schemes.pgcs_params import DdpOverlapParams, PgcsParams  # noqa: E402

SCHEMES.register("pgcs", PgcsParams, "testbed.training.schemes.pgcs:run",
                 "multi-expert: one expert's sync overlaps the next one's compute (overlap: false = sequential)")
SCHEMES.register("ddp_overlap", DdpOverlapParams, "testbed.training.schemes.pgcs:run",
                 "multi-expert baseline: DDP-style bucketed sync overlapping one expert's backward")


def uses_server(name: str) -> bool:
    return bool(SCHEMES.entry(name).params.uses_server)


__all__ = ["SCHEMES", "uses_server"]
