"""Link shaping as a library: shape model, netlink apply/change/clear/show, traces, probes.

Imports neither ``testbed`` nor ``topologies``: it can shape a real NIC on its own.

``LinkShape`` (pydantic-validated, ~0.25 s to import) is loaded on first use,
so that the userspace impairment daemon, one Python process per impaired link
direction, starts without it: importing it eagerly cost every daemon 0.36 s of
CPU, 20 s for the 56 daemons of an 8-DC full mesh on a two-core machine.
"""

from typing import Any

from .errors import CapabilityMissing, TrafficControlError, ValidationError

__all__ = ["CapabilityMissing", "LinkShape", "TrafficControlError", "ValidationError"]


def __getattr__(name: str) -> Any:
    if name == "LinkShape":
        from .shape import LinkShape

        return LinkShape
    raise AttributeError(f"module 'traffic_control' has no attribute {name!r}")
