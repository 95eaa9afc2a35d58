"""Which servers must hold which container image (testbed.cluster.images.needed), worked out on paper."""

from __future__ import annotations

from testbed.cluster.images import ensure, needed
from testbed.cluster.model import from_dict as cluster_of
from testbed.network.docker_hosts import DEFAULT_IMAGE
from topologies.model import from_dict as topology


def topo(**runtime_of: dict) -> object:
    return topology({"name": "t", "defaults": {"hosts": 1},
                     "dcs": [{"name": n, **runtime_of.get(n, {})} for n in ("a", "b", "c", "d")],
                     "links": [{"a": "a", "b": "b", "rate": "10Mbit"}, {"a": "b", "b": "c", "rate": "10Mbit"},
                               {"a": "c", "b": "d", "rate": "10Mbit"}]})


def test_only_other_servers_with_container_hosts_need_an_image_each_names_its_dcs():
    t = topo(a={"runtime": "docker"}, b={"runtime": "docker"}, c={"runtime": "docker", "image": "x/y:1"})
    where = {"a": "s1", "b": "s2", "c": "s2", "d": "s3"}
    # the launcher's own DC a needs nothing sent; d is a process host's DC
    assert needed(t, where, "s1") == {"s2": {DEFAULT_IMAGE: ["b"], "x/y:1": ["c"]}}
    assert needed(t, where, "s2") == {"s1": {DEFAULT_IMAGE: ["a"]}}


def test_process_hosts_everywhere_need_no_image_and_docker_is_not_asked():
    cluster = cluster_of({"servers": [{"name": "s1", "address": "10.0.0.1"}, {"name": "s2", "address": "10.0.0.2"}]})
    # no Docker call is made (none runs in a unit test): nothing to send
    assert ensure(topo(), cluster, {"a": "s1", "b": "s2", "c": "s2", "d": "s2"}, log=print) == {}
