"""Topology model and bundled topologies (DCs, WAN graph, routes).

May use :mod:`traffic_control`'s shape model; never imports :mod:`testbed`.
"""

from .loader import bundled, dump, load
from .model import DataCenter, Topology, WanLink, from_dict

__all__ = ["DataCenter", "Topology", "WanLink", "bundled", "dump", "from_dict", "load"]
