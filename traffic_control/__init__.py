"""Link shaping as a library: shape model, netlink apply/change/clear/show, traces, probes.

Imports neither ``testbed`` nor ``topologies``: it can shape a real NIC on its own.
"""

from .errors import CapabilityMissing, TrafficControlError, ValidationError
from .shape import LinkShape

__all__ = ["CapabilityMissing", "LinkShape", "TrafficControlError", "ValidationError"]
