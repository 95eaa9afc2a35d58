"""gpus: per host: assignment without overlap, indices as given, sharing only when asked, clear errors."""

from __future__ import annotations

import pytest

from testbed.network import docker_hosts
from testbed.network.addressing import plan_network
from testbed.network.gpus import assign, docker_request, visible_devices
from topologies import from_dict
from traffic_control.errors import ValidationError


def topo(a: dict, b: dict | None = None, **top):
    return from_dict({"dcs": [{"name": "a", "hosts": 2, **a}, {"name": "b", "hosts": 2, **(b or {})}],
                      "links": [{"a": "a", "b": "b"}], "ps": "a", **top})


def hosts(t):
    return [(n.name, n.dc) for n in plan_network(t).nodes.values() if n.role == "host"]


def test_counts_are_assigned_in_plan_order_without_overlap():
    t = topo({"gpus": 1}, {"gpus": 2})
    got = assign(t, hosts(t), 8)
    assert got == {"a-h1": (0,), "a-h2": (1,), "b-h1": (2, 3), "b-h2": (4, 5)}
    assert "a-ps" not in got  # the parameter server gets none (it sees no GPU: CUDA_VISIBLE_DEVICES "")


def test_indices_are_taken_as_given_and_counts_fill_around_them():
    t = topo({"hosts": 1, "gpus": [2, 3]}, {"gpus": 1})
    assert assign(t, hosts(t), 4) == {"a-h1": (2, 3), "b-h1": (0,), "b-h2": (1,)}


def test_no_gpus_asked_means_no_assignment_and_no_machine_query():
    t = topo({})
    assert assign(t, hosts(t), 0) == {}


@pytest.mark.parametrize("a, b, available, field, words", [
    ({"gpus": 1}, None, 0, "dcs[0].gpus", "no GPU"),
    ({"gpus": [4]}, None, 4, "dcs[0].gpus", "device 4 does not exist"),
    ({"gpus": [0]}, None, 4, "dcs[0].gpus", "GPU 0 given to both a-h1 and a-h2"),
    ({"gpus": 2}, {"gpus": 2}, 6, "dcs[1].gpus", "8 GPUs in all"),
    ({"gpus": 3}, None, 2, "dcs[0].gpus", "this machine has 2"),
])
def test_impossible_requests_name_the_field_and_the_fix(a, b, available, field, words):
    t = topo(a, b)
    with pytest.raises(ValidationError) as e:
        assign(t, hosts(t), available)
    assert e.value.field == field and words in str(e.value) and "fix" in str(e.value), str(e.value)


def test_sharing_when_asked_for():
    t = topo({"gpus": 1}, {"gpus": 1}, gpu_sharing=True)
    got = assign(t, hosts(t), 2)
    assert got == {"a-h1": (0,), "a-h2": (1,), "b-h1": (0,), "b-h2": (1,)}
    t = topo({"gpus": [0]}, None, gpu_sharing=True)
    assert assign(t, hosts(t), 1) == {"a-h1": (0,), "a-h2": (0,)}


def test_how_a_host_gets_its_devices():
    assert visible_devices((1, 3)) == "1,3" and visible_devices(None) == ""
    assert docker_request((0, 2)) == ["--gpus", '"device=0,2"']
    argv = docker_hosts.run_argv("a-h1", docker_hosts.HostConfig("img", gpus=(1,)), [])
    assert argv[argv.index("--gpus") + 1] == '"device=1"'
    assert "--gpus" not in docker_hosts.run_argv("a-h1", docker_hosts.HostConfig("img"), [])


def test_gpus_round_trip_through_the_spec():
    t = topo({"gpus": [0, 1]}, {"gpus": 1}, gpu_sharing=True)
    assert from_dict(t.to_dict()) == t and t.to_dict()["gpu_sharing"] is True


def test_a_machine_without_gpus_refuses_them_at_dry_run(tmp_path):
    """From the command line, as a user meets it: exit 2 naming the field, nothing built."""
    from testbed.network.gpus import machine_gpus
    from tests.conftest import run_cli

    if machine_gpus():
        pytest.skip("this machine has GPUs")
    spec = tmp_path / "g.yaml"
    spec.write_text("name: g\ndefaults: {hosts: 1}\ndcs: [{name: a, gpus: 1}, b]\n"
                    "links: [{a: a, b: b, rate: 10Mbit, delay: 5ms}]\n")
    r = run_cli("net", "up", str(spec), "--dry-run", "--impairment", "userspace")
    assert r.returncode == 2 and "dcs[0].gpus: this machine has no GPU" in r.stderr, r.stderr
