"""Shape mode's plan (testbed.cluster.shaping): one server per DC with hosts, the path each server's shaper
stands for (a direct link exactly, a relayed path composed), and refusals naming the field."""

from __future__ import annotations

import json

import pytest
import yaml

from testbed.cluster.model import from_dict
from testbed.cluster.shaping import ServerShaping, lan_not_emulated, path_shape, placement, plan
from tests.conftest import run_cli
from topologies.model import from_dict as topology
from traffic_control.errors import ValidationError


def cluster(n: int, **extra: object):
    return from_dict({"mode": "shape", "servers": [{"name": f"s{i}", "address": f"10.0.0.{i}"}
                                                   for i in range(1, n + 1)], **extra})


def relay(**hop2: object):
    return topology({"name": "r", "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 0},
                                          {"name": "c", "hosts": 1}],
                     "links": [{"a": "a", "b": "b", "rate": "40Mbit", "delay": "5ms", "loss": "1%"},
                               {"a": "b", "b": "c", "rate": "30Mbit", "delay": "3ms", "loss": "2%", **hop2}]})


def test_a_direct_link_is_taken_exactly_and_a_relayed_path_composed():
    direct = topology({"name": "d", "dcs": ["a", "c"],
                       "links": [{"a": "a", "b": "c", "rate": "40Mbit", "delay": "5ms", "jitter": "1ms",
                                  "limit": 77}]})
    shape, path = path_shape(direct, "a", "c")
    assert path == ("a", "c") and shape.jitter_s == 0.001 and shape.limit == 77 and shape.queue_rtt_s == 0.01
    shape, path = path_shape(relay(), "a", "c")
    assert path == ("a", "b", "c")
    assert shape.rate_bps == 30e6 and shape.delay_s == pytest.approx(0.008)
    assert shape.loss_pct == pytest.approx(100 * (1 - 0.99 * 0.98)) and shape.queue_rtt_s == pytest.approx(0.016)
    # one jittered hop carries its jitter onto the path
    shape, _ = path_shape(relay(jitter="1ms"), "c", "a")
    assert shape.jitter_s == 0.001 and shape.rate_bps == 30e6


@pytest.mark.parametrize("hop2, words", [
    ({"jitter": "1ms", "links0": {"jitter": "1ms"}}, "two jittered hops"),
    ({"duplicate": "1%"}, "duplication"),
    ({"reorder_probability": "5%", "reorder_gap": 1, "jitter": "2ms"}, "reordering"),
])
def test_what_does_not_compose_over_hops_is_refused_naming_the_link(hop2, words):
    first = hop2.pop("links0", {})
    t = relay(**hop2)
    if first:
        t = topology({**t.to_dict(), "links": [{**t.to_dict()["links"][0], **first}, t.to_dict()["links"][1]]})
    with pytest.raises(ValidationError) as e:
        path_shape(t, "a", "c")
    assert e.value.field.startswith("links[") and words in str(e.value)


def test_placement_one_server_per_dc_with_hosts():
    assert placement(relay(), cluster(2)) == {"a": "s1", "c": "s2"}
    assert placement(relay(), cluster(3, launcher="s3")) == {"a": "s3", "c": "s1"}
    with pytest.raises(ValidationError, match="one server per DC with hosts: 2") as e:
        placement(relay(), cluster(1))
    assert e.value.field == "servers"
    with pytest.raises(ValidationError, match="already is DC a") as e:
        placement(relay(), cluster(2, placement={"a": "s1", "b": "s2", "c": "s1"}))
    assert e.value.field == "placement.c"


def test_a_dcs_gpus_must_fit_its_servers_where_the_file_says_how_many():
    topo = topology({"name": "g", "dcs": [{"name": "a", "hosts": 2, "gpus": 1}, {"name": "c", "hosts": 1, "gpus": 2}],
                     "links": [{"a": "a", "b": "c", "rate": "40Mbit", "delay": "5ms"}]})
    servers = [{"name": "s1", "address": "10.0.0.1", "gpus": 2}, {"name": "s2", "address": "10.0.0.2", "gpus": 1}]
    with pytest.raises(ValidationError, match="'s2' has 1 GPUs; DC c's hosts ask for 2") as e:
        placement(topo, from_dict({"mode": "shape", "servers": servers}))
    assert e.value.field == "placement.c"
    servers[1]["gpus"] = 2
    assert placement(topo, from_dict({"mode": "shape", "servers": servers})) == {"a": "s1", "c": "s2"}
    unsaid = [{"name": "s1", "address": "10.0.0.1"}, {"name": "s2", "address": "10.0.0.2"}]  # each checks its own
    assert placement(topo, from_dict({"mode": "shape", "servers": unsaid})) == {"a": "s1", "c": "s2"}


def test_plan_round_trips_and_refuses_lan_shapes():
    p = plan(relay(), cluster(2))
    assert [e.dst_dc for e in p["s1"].egress] == ["c"] and p["s2"].egress[0].address == "10.0.0.1"
    assert ServerShaping.from_dict(json.loads(json.dumps(p["s2"].to_dict()))) == p["s2"]
    lan = topology({**relay().to_dict(), "dcs": [{"name": "a", "hosts": 1, "lan": {"loss": "1%"}},
                                                 {"name": "b", "hosts": 0}, {"name": "c", "hosts": 1}]})
    with pytest.raises(ValidationError) as e:
        plan(lan, cluster(2))
    assert e.value.field == "dcs[0].lan"
    # a LAN rate alone (every bundled topology has one) is not emulated, and said so
    rate = topology({**relay().to_dict(), "dcs": [{"name": "a", "hosts": 2, "lan": {"rate": "1Gbit"}},
                                                  {"name": "b", "hosts": 0}, {"name": "c", "hosts": 1}]})
    assert plan(rate, cluster(2))["s1"].dc == "a"
    assert "not emulated in shape mode" in lan_not_emulated(rate, "a")[0] and lan_not_emulated(rate, "c") == []


def test_cluster_place_prints_every_shaped_path(tmp_path):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(relay().to_dict()))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"mode": "shape", "servers": [
        {"name": "s1", "address": "10.0.0.1"}, {"name": "s2", "address": "10.0.0.2"},
        {"name": "s3", "address": "10.0.0.3"}]}))
    r = run_cli("cluster", "place", str(tmp_path / "t.yaml"), "--cluster", str(tmp_path / "c.yaml"))
    assert r.returncode == 0, r.stderr
    assert "a->c (s2 via b): 30Mbit, delay 8ms, loss 2.98%" in r.stdout and "not used: s3" in r.stdout, r.stdout
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"mode": "shape", "servers": [
        {"name": "s1", "address": "10.0.0.1"}]}))
    r = run_cli("cluster", "place", str(tmp_path / "t.yaml"), "--cluster", str(tmp_path / "c.yaml"))
    assert r.returncode == 2 and "servers" in r.stderr and "one server per DC" in r.stderr, r.stderr


def test_one_way_delays_across_servers_take_out_the_receivers_clock_offset_from_the_senders():
    from testbed.cluster.view import offset_between
    from testbed.network.delay_check import corrected

    clocks = {"s2": (250_000_000, 20_000), "s3": (-40_000_000, 30_000)}  # ns: ahead / behind the launcher's
    assert offset_between(clocks, "s1", "s2") == pytest.approx((0.25, 2e-5))  # s1, the launcher: (0, 0)
    assert offset_between(clocks, "s2", "s3") == pytest.approx((-0.29, 5e-5))
    # a datagram sent from s1 at its 0.000 s, taking 5 ms, arrives at s2's clock reading 0.255 s
    got = {"mean_s": 0.255, "min_s": 0.2549, "p50_s": 0.255, "p99_s": 0.256, "max_s": 0.257, "sd_s": 0.0004}
    fixed = corrected(got, offset_between(clocks, "s1", "s2")[0])
    assert fixed["mean_s"] == pytest.approx(0.005) and fixed["p99_s"] == pytest.approx(0.006)
    assert fixed["sd_s"] == 0.0004  # a spread is no time of day


def _states(topo, backend: str = "userspace") -> dict:
    """Each shaping server's state as shape-up writes it (testbed.cluster.shaper.up)."""
    return {name: {"mode": "shape", "server": name, "topology_spec": topo.to_dict(), "shaping": p.to_dict(),
                   "impairment": {"backend": backend}}
            for name, p in plan(topo, cluster(2)).items()}


def test_net_set_in_shape_mode_recomposes_every_path_over_the_link():
    """relay3 (a on s1, c on s2, b relays): a-b's delay 5 -> 12 ms moves both a->c and c->a (each path's delay
    and the round trip its queue is sized for); b-c's rate only on the one way given."""
    from testbed.cluster.shapeset import plan_change

    states = _states(relay())
    ch = plan_change(states, [("a", "b"), ("b", "a")], {"delay_s": 0.012})
    assert set(ch.shapes) == {"s1", "s2"}
    ac, ca = ch.shapes["s1"]["c"], ch.shapes["s2"]["a"]
    assert ac.delay_s == pytest.approx(0.015) and ca.delay_s == pytest.approx(0.015)
    assert ac.queue_rtt_s == pytest.approx(0.030) and ac.rate_bps == 30e6
    assert ch.topology.link("a", "b").forward.delay_s == pytest.approx(0.012)
    one = plan_change(states, [("c", "b")], {"rate_bps": 10e6})
    assert set(one.shapes) == {"s2"} and one.shapes["s2"]["a"].rate_bps == 10e6
    # a change from the changed network: the new topology is where the next starts
    assert json.loads(ch.payload("s2"))["topology"]["links"][0]["delay"] == "12ms"


@pytest.mark.parametrize("dirs, changes, field, words", [
    ([("a", "b")], {"jitter_s": 0.001}, "links[", "two jittered hops"),  # b-c has jitter already
    ([("a", "c")], {"delay_s": 0.001}, "net set", "no link a-c"),
    ([("a", "b")], {"duplicate_pct": 1.0}, "links[", "duplication"),
])
def test_a_change_the_paths_cannot_take_is_refused_before_any_server(dirs, changes, field, words):
    from testbed.cluster.shapeset import plan_change

    with pytest.raises(ValidationError) as e:
        plan_change(_states(relay(jitter="1ms")), dirs, changes)
    assert e.value.field.startswith(field) and words in str(e.value), str(e.value)


def test_a_backend_that_cannot_give_the_new_shape_refuses_it_by_path():
    from testbed.cluster.shapeset import plan_change

    direct = topology({"name": "d", "dcs": ["a", "c"], "links": [{"a": "a", "b": "c", "rate": "40Mbit"}]})
    with pytest.raises(ValidationError) as e:
        plan_change(_states(direct, backend="none"), [("a", "c")], {"delay_s": 0.005})
    assert e.value.field == "a->c" and "without an impairment backend" in str(e.value)
    with pytest.raises(ValidationError) as e:
        plan_change(_states(direct), [("a", "c")], {"duplicate_pct": 2.0})
    assert e.value.field == "a->c.duplicate"


def test_a_schedule_in_shape_mode_is_planned_whole_each_event_from_the_last():
    from testbed.cluster.shapeset import paper_states, plan_schedule
    from traffic_control.schedule import parse_schedule

    topo = relay()
    events = parse_schedule("time,link,rate,delay,jitter,loss,state\n3,a-b,,10ms,,,\n6,b-c,20Mbit,,,,\n")
    first, second = plan_schedule(paper_states(topo, plan(topo, cluster(2))), events)
    assert first.shapes["s1"]["c"].delay_s == pytest.approx(0.013)
    # the second event starts from the first: the path keeps its 13 ms and takes the new rate
    assert second.shapes["s1"]["c"].delay_s == pytest.approx(0.013) and second.shapes["s1"]["c"].rate_bps == 20e6
    down = parse_schedule("time,link,rate,delay,jitter,loss,state\n3,a-b,,10ms,,,\n4,a-b,,,,,down\n"
                          "5,b-c,,,,,down\n6,a-b,,4ms,,,up\n7,b-c,,,,,up\n")
    steps = plan_schedule(paper_states(topo, plan(topo, cluster(2))), down)
    assert [sorted(s.links_down) for s in steps] == [[], ["a<->b"], ["a<->b", "b<->c"], ["b<->c"], []]
    # a path stays cut while any link on its route is down, and keeps taking the changes made meanwhile
    assert [s.cut for s in steps] == [{"s1": [], "s2": []}] + [{"s1": ["c"], "s2": ["a"]}] * 3 + [
        {"s1": [], "s2": []}]
    assert steps[3].shapes["s1"]["c"].delay_s == pytest.approx(0.007)
    with pytest.raises(ValidationError) as e:  # a link the topology lacks, named
        plan_schedule(paper_states(topo, plan(topo, cluster(2))),
                      parse_schedule("time,link,rate,delay,jitter,loss,state\n3,a-c,,,,,down\n"))
    assert e.value.field == "schedule[0]" and "no link a-c" in str(e.value)


def test_a_link_down_cuts_only_the_paths_whose_routes_cross_it():
    """A triangle whose a-c link the routes bypass (a->c goes over b, the cheaper way): a-c down cuts nothing;
    a-b down cuts a<->c and a<->b both ways, and b's own paths to c stay up.  The payload carries each
    server's whole cut set."""
    from testbed.cluster.shapeset import crosses, paper_states, plan_change

    tri = topology({"name": "t", "dcs": ["a", "b", "c"],
                    "links": [{"a": "a", "b": "b", "rate": "40Mbit", "delay": "2ms"},
                              {"a": "b", "b": "c", "rate": "40Mbit", "delay": "2ms"},
                              {"a": "a", "b": "c", "rate": "40Mbit", "delay": "50ms"}]})
    states = paper_states(tri, plan(tri, cluster(3)))
    assert {e["dst_dc"]: tuple(e["path"]) for e in states["s1"]["shaping"]["egress"]}["c"] == ("a", "b", "c")
    bypassed = plan_change(states, [("c", "a"), ("a", "c")], {}, "down")
    assert bypassed.links_down == ("a<->c",) and not bypassed.shapes
    assert bypassed.cut == {"s1": [], "s2": [], "s3": []}
    cut = plan_change(states, [("b", "a"), ("a", "b")], {}, "down")
    assert cut.links_down == ("a<->b",)
    assert cut.cut == {"s1": ["b", "c"], "s2": ["a"], "s3": ["a"]}
    assert json.loads(cut.payload("s2"))["cut"] == ["a"] and json.loads(cut.payload("s2"))["links_down"] == ["a<->b"]
    assert crosses(("c", "b", "a"), ["a<->b"]) and not crosses(("c", "b"), ["a<->b"])


def test_a_docker_dcs_hosts_and_its_parameter_server_are_containers_on_its_server_sharing_its_network(tmp_path):
    from testbed.cluster import shape_hosts
    from testbed.network import docker_hosts

    t = topology({**relay().to_dict(), "ps": "c",
                  "dcs": [{"name": "a", "hosts": 2, "runtime": "docker", "image": "me/t:1", "cpu": 0.5,
                           "env": {"X": "1"}},
                          {"name": "b", "hosts": 0}, {"name": "c", "hosts": 1, "runtime": "docker"}]})
    assert set(plan(t, cluster(2))) == {"s1", "s2"}  # shape mode takes containers, with their limits
    for key, value in (("cpu", 0.5), ("memory", "1GiB")):  # a process host's would bind nothing: refused
        proc = topology({**t.to_dict(), "dcs": [{"name": "a", "hosts": 2, key: value}, {"name": "b", "hosts": 0},
                                                {"name": "c", "hosts": 1, "runtime": "docker"}]})
        with pytest.raises(ValidationError) as e:
            plan(proc, cluster(2))
        assert e.value.field == f"dcs[0].{key}" and "runtime: docker" in str(e.value), e.value
    a = shape_hosts.hosts_of(t, "a", {"a-h2": (1,)})
    assert set(a) == {"a-h1", "a-h2"}
    assert a["a-h1"] == docker_hosts.HostConfig("me/t:1", (), (("X", "1"),), 0.5, None, ())
    assert a["a-h2"].gpus == (1,)
    assert set(shape_hosts.hosts_of(t, "c")) == {"c-h1", "c-ps"}  # the parameter server's DC holds it
    assert shape_hosts.hosts_of(relay(), "a") == {}  # process hosts: no container
    argv = " ".join(docker_hosts.run_argv("a-h1", a["a-h1"], [tmp_path], network="host"))
    assert "--network host" in argv and "--hostname" not in argv and "--cap-drop ALL" in argv
    assert "--cpus 0.5" in argv and f"--volume {tmp_path}:{tmp_path}:rw" in argv
