"""Topology model: bundled topologies, YAML/JSON round trips, Python files, bad input, routing."""

from __future__ import annotations

import copy
import json

import networkx as nx
import pytest
import yaml

from topologies import Topology, bundled, dump, from_dict, load
from topologies.loader import BUNDLED_DIR
from topologies.model import MAX_DC_NAME
from traffic_control import LinkShape, ValidationError

BUNDLED = ["geo_wan", "star", "three_dc_triangle", "two_dc"]


def test_bundled_list():
    assert set(BUNDLED) <= set(bundled())


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_loads_and_validates(name):
    t = load(name)
    assert t.name == name
    assert len(t.dcs) >= 2 and t.links
    g = t.dc_graph()
    assert nx.is_strongly_connected(g)
    for _u, _v, d in g.edges(data=True):
        assert d["rate_bps"] > 0 and d["delay_s"] >= 0
    assert load(BUNDLED_DIR / f"{name}.yaml") == t  # by path too


@pytest.mark.parametrize("name", BUNDLED)
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_round_trip(name, fmt, tmp_path):
    t = load(name)
    text = dump(t, fmt)
    d = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert from_dict(d) == t
    p = tmp_path / f"{name}.{fmt}"
    p.write_text(text)
    assert load(p) == t


def test_geo_wan_facts():
    t = load("geo_wan")
    assert len(t.dcs) >= 5
    n = len(t.dcs)
    assert len(t.links) < n * (n - 1) // 2, "not a full mesh"
    assert t.scale == pytest.approx(0.1)
    vo = t.link("virginia", "ohio")
    assert vo.forward.delay_s * 2 == pytest.approx(0.011)
    assert vo.forward.rate_bps == pytest.approx(1.12e9 * 0.1)
    assert t.link("virginia", "sg").forward.delay_s * 2 == pytest.approx(0.230)
    full = load("geo_wan", scale=10)  # undo the default scale
    assert full.link("virginia", "london").forward.rate_bps == pytest.approx(1.16e9)
    assert full.scale == pytest.approx(1.0)


def test_scale_round_trip_keeps_rates():
    t = load("geo_wan", scale=0.5)
    assert t.scale == pytest.approx(0.05)
    again = from_dict(yaml.safe_load(dump(t)))
    for a, b in zip(t.links, again.links):
        assert a.forward.rate_bps == pytest.approx(b.forward.rate_bps, rel=1e-9)
    assert again.scale == pytest.approx(t.scale)


def test_triangle_is_heterogeneous_and_star_is_a_star():
    t = load("three_dc_triangle")
    rates = sorted(lk.forward.rate_bps for lk in t.links)
    assert rates[0] < rates[-1] / 2
    s = load("star")
    hub = s.ps
    assert all(hub in (lk.a, lk.b) for lk in s.links)


def test_asymmetric_round_trip():
    spec = {"name": "asym", "dcs": ["a", "b"],
            "links": [{"a": "a", "b": "b", "rate": "50Mbit",
                       "forward": {"delay": "10ms", "jitter": "1ms"},
                       "reverse": {"delay": "30ms", "loss": "0.5%", "rate": "20Mbit"}}]}
    t = from_dict(spec)
    lk = t.links[0]
    assert lk.forward == LinkShape(rate_bps=50e6, delay_s=0.01, jitter_s=0.001)
    assert lk.reverse == LinkShape(rate_bps=20e6, delay_s=0.03, loss_pct=0.5)
    assert not lk.symmetric
    assert lk.shape("a", "b") is lk.forward and lk.shape("b", "a") is lk.reverse
    assert from_dict(json.loads(dump(t, "json"))) == t
    g = t.dc_graph()
    assert g["a"]["b"]["delay_s"] == 0.01 and g["b"]["a"]["delay_s"] == 0.03
    assert g["b"]["a"]["rate_bps"] == 20e6
    assert t.expected_rtt("a", "b") == pytest.approx(0.04)


def test_rtt_and_defaults():
    spec = {"name": "d", "defaults": {"hosts": 3, "wan": {"rate": "1Gbit", "delay": "5ms"}, "lan": {"rate": "10Gbit"}},
            "dcs": ["a", {"name": "b", "hosts": 1, "cpu": 0.5}], "links": [{"a": "a", "b": "b", "rtt": "40ms"}]}
    t = from_dict(spec)
    assert t.dc("a").hosts == 3 and t.dc("b").hosts == 1 and t.dc("b").cpu == 0.5
    assert t.dc("a").lan.rate_bps == 10e9
    assert t.links[0].forward.delay_s == pytest.approx(0.02)  # rtt wins over the default delay
    assert t.links[0].forward.rate_bps == 1e9
    assert from_dict(t.to_dict()) == t


def test_python_topology_file(tmp_path):
    p = tmp_path / "ring.py"
    p.write_text(
        "from topologies import from_dict\n"
        "def topology():\n"
        "    names = [f'dc{i}' for i in range(5)]\n"
        "    links = [{'a': names[i], 'b': names[(i + 1) % 5], 'rate': f'{10 * (i + 1)}Mbit', 'delay': f'{i + 1}ms'}\n"
        "             for i in range(5)]\n"
        "    return from_dict({'name': 'ring', 'dcs': names, 'links': links, 'ps': 'dc0'})\n")
    t = load(p)
    assert isinstance(t, Topology) and t.name == "ring" and len(t.links) == 5
    assert t.path("dc0", "dc3") == ["dc0", "dc1", "dc2", "dc3"]  # 1 + 2 + 3 ms beats 5 + 4 ms
    p2 = tmp_path / "dictspec.py"
    p2.write_text("TOPOLOGY = {'name': 'x', 'dcs': ['a', 'b'], 'links': [{'a': 'a', 'b': 'b', 'rate': '1Gbit'}]}\n")
    assert load(p2).links[0].forward.rate_bps == 1e9
    p3 = tmp_path / "nothing.py"
    p3.write_text("X = 1\n")
    with pytest.raises(ValidationError):
        load(p3)
    # a Python topology dumps to a spec that loads back equal
    assert from_dict(yaml.safe_load(dump(t))) == t


def test_unknown_topology_name():
    with pytest.raises(ValidationError) as ei:
        load("no_such_topology_xyz")
    assert ei.value.field == "topology"


def test_syntax_errors_are_validation_errors(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ndcs: [a, b\n")
    with pytest.raises(ValidationError):
        load(p)
    j = tmp_path / "bad.json"
    j.write_text("{nope")
    with pytest.raises(ValidationError):
        load(j)


# --------------------------------------------------------------- bad input
GOOD = {"name": "t", "dcs": [{"name": "east", "hosts": 2}, {"name": "west", "hosts": 2}, {"name": "north", "hosts": 1}],
        "links": [{"a": "east", "b": "west", "rate": "100Mbit", "delay": "10ms"},
                  {"a": "west", "b": "north", "rate": "50Mbit", "delay": "5ms"}],
        "ps": "east"}


def mutate(fn):
    d = copy.deepcopy(GOOD)
    fn(d)
    return d


def _set(path, value):
    def f(d):
        cur = d
        for k in path[:-1]:
            cur = cur[k]
        cur[path[-1]] = value
    return f


#: (id, spec, field path): every bad-input case of issue 2.
BAD = [
    ("unknown-top-key", mutate(_set(["colour"], "red")), "colour"),
    ("unknown-dc-key", mutate(_set(["dcs", 0, "accelerators"], 4)), "dcs[0].accelerators"),
    ("unknown-link-key", mutate(_set(["links", 1, "latency"], "5ms")), "links[1].latency"),
    ("unknown-forward-key", mutate(_set(["links", 0, "forward"], {"bandwidth": "1Gbit"})), "links[0].forward.bandwidth"),
    ("unknown-defaults-key", mutate(_set(["defaults"], {"hots": 2})), "defaults.hots"),
    ("negative-rate", mutate(_set(["links", 0, "rate"], "-100Mbit")), "links[0].rate"),
    ("negative-rate-number", mutate(_set(["links", 0, "rate"], -5)), "links[0].rate"),
    ("zero-rate", mutate(_set(["links", 1, "rate"], 0)), "links[1].rate"),
    ("zero-rate-units", mutate(_set(["links", 1, "rate"], "0Gbit")), "links[1].rate"),
    ("zero-reverse-rate", mutate(_set(["links", 1, "reverse"], {"rate": "0Mbit"})), "links[1].reverse.rate"),
    ("zero-lan-rate", mutate(_set(["dcs", 1, "lan"], {"rate": 0})), "dcs[1].lan.rate"),
    ("loss-above-100", mutate(_set(["links", 0, "loss"], "150%")), "links[0].loss"),
    ("loss-below-0", mutate(_set(["links", 0, "loss"], -0.5)), "links[0].loss"),
    ("loss-forward", mutate(_set(["links", 0, "forward"], {"loss": 101})), "links[0].forward.loss"),
    ("jitter-without-delay", mutate(lambda d: d["links"][1].update(delay="0ms", jitter="2ms")), "links[1].jitter"),
    ("jitter-without-delay-rev", mutate(_set(["links", 0, "reverse"], {"delay": 0, "jitter": "1ms"})),
     "links[0].reverse.jitter"),
    ("disconnected", mutate(lambda d: d["links"].pop()), "links"),
    ("disconnected-4", mutate(lambda d: (d["dcs"].append({"name": "south"}))), "links"),
    ("no-links", mutate(_set(["links"], [])), "links"),
    ("duplicate-dc", mutate(_set(["dcs", 2, "name"], "east")), "dcs[2].name"),
    ("duplicate-link", mutate(lambda d: d["links"].append({"a": "west", "b": "east", "rate": "1Gbit"})), "links[2]"),
    ("overlong-name", mutate(_set(["dcs", 2, "name"], "n" * (MAX_DC_NAME + 1))), "dcs[2].name"),
    ("overlong-utf8", mutate(_set(["dcs", 2, "name"], "nörth")), "dcs[2].name"),
    ("bad-name-chars", mutate(_set(["dcs", 2, "name"], "no rth")), "dcs[2].name"),
    ("name-starts-digit", mutate(_set(["dcs", 2, "name"], "1north")), "dcs[2].name"),
    ("link-to-missing-dc", mutate(_set(["links", 1, "b"], "south")), "links[1].b"),
    ("link-from-missing-dc", mutate(_set(["links", 0, "a"], "mars")), "links[0].a"),
    ("link-self", mutate(_set(["links", 1, "b"], "west")), "links[1].b"),
    ("link-missing-end", mutate(lambda d: d["links"][1].pop("b")), "links[1].b"),
    ("ps-missing-dc", mutate(_set(["ps"], "mars")), "ps"),
    ("unparseable-rate", mutate(_set(["links", 0, "rate"], "100 Mbps-ish")), "links[0].rate"),
    ("unknown-rate-unit", mutate(_set(["links", 0, "rate"], "100Mbyte")), "links[0].rate"),
    ("unparseable-delay", mutate(_set(["links", 0, "delay"], "10 lightyears")), "links[0].delay"),
    ("unparseable-loss", mutate(_set(["links", 0, "loss"], "a lot")), "links[0].loss"),
    ("unparseable-rtt", mutate(_set(["links", 0, "forward"], {"rtt": "x"})), "links[0].forward.rtt"),
    ("unparseable-lan", mutate(_set(["dcs", 0, "lan"], {"delay": "1 fortnight"})), "dcs[0].lan.delay"),
    ("hosts-negative", mutate(_set(["dcs", 0, "hosts"], -1)), "dcs[0].hosts"),
    ("hosts-text", mutate(_set(["dcs", 0, "hosts"], "two")), "dcs[0].hosts"),
    ("cpu-zero", mutate(_set(["dcs", 0, "cpu"], 0)), "dcs[0].cpu"),
    ("delay-and-rtt", mutate(lambda d: d["links"][0].update(rtt="20ms")), "links[0].rtt"),
    ("dcs-empty", mutate(_set(["dcs"], [])), "dcs"),
    ("switch-kind", mutate(_set(["switch"], "hub")), "switch"),
    ("scale-zero", mutate(_set(["scale"], 0)), "scale"),
    ("route-no-link", mutate(_set(["routes"], {"east->north": ["east", "north"]})), "routes['east->north']"),
    ("route-bad-key", mutate(_set(["routes"], {"east-north": ["east", "west", "north"]})), "routes['east-north']"),
]


@pytest.mark.parametrize("spec,field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(spec, field):
    with pytest.raises(ValidationError) as ei:
        from_dict(spec)
    e = ei.value
    assert e.field == field, str(e)
    assert str(e).startswith(f"{field}: ")
    assert e.fix, f"no fix given: {e}"


def test_good_spec_is_good():
    t = from_dict(GOOD)
    assert t.dc_names == ["east", "west", "north"]


def test_max_length_name_fits_interface_names():
    from testbed.network import naming

    name = "n" * MAX_DC_NAME
    t = from_dict(mutate(_set(["dcs", 2, "name"], name)) | {"links": [
        {"a": "east", "b": "west", "rate": "1Gbit"}, {"a": "west", "b": name, "rate": "1Gbit"}]})
    assert t.dc(name)
    for n in (naming.bridge_name(name), naming.port_name(name, 66), naming.wan_ifname(name)):
        assert len(n.encode()) <= 15


# ----------------------------------------------------------------- routing
def test_paths_triangle():
    t = load("three_dc_triangle")
    # east-west direct (20 ms) beats via central (10 + 15 ms)
    assert t.path("east", "west") == ["east", "west"]
    assert t.path("west", "east") == ["west", "east"]
    assert t.next_hop("east", "central") == "central"
    slow = t.with_link_shape("east", "west", delay_s=0.030)
    assert slow.path("east", "west") == ["east", "central", "west"]
    assert slow.next_hop("east", "west") == "central" and slow.next_hop("central", "west") == "west"
    assert slow.expected_rtt("east", "west") == pytest.approx(2 * 0.025)


def test_paths_star():
    t = load("star")
    spokes = [d for d in t.dc_names if d != "hub"]
    for a in spokes:
        for b in spokes:
            if a != b:
                assert t.path(a, b) == [a, "hub", b]
                assert t.next_hop(a, b) == "hub"
        assert t.path(a, "hub") == [a, "hub"]
    assert t.expected_rtt("spoke1", "spoke4") == pytest.approx(2 * (0.010 + 0.030))


def test_paths_geo_wan():
    t = load("geo_wan")
    assert t.path("london", "tokyo") == ["london", "virginia", "oregon", "tokyo"]
    assert t.path("seoul", "ohio") == ["seoul", "tokyo", "oregon", "virginia", "ohio"]
    assert t.path("sg", "ohio") == ["sg", "virginia", "ohio"]  # 115 + 5.5 ms beats 34.5 + 49 + 33.5 + 5.5 ms
    g = t.dc_graph()
    for a in t.dc_names:
        for b in t.dc_names:
            if a == b:
                continue
            p = t.path(a, b)
            assert p[0] == a and p[-1] == b and len(set(p)) == len(p)
            assert all(g.has_edge(u, v) for u, v in zip(p, p[1:]))
            # least one-way delay
            best = nx.shortest_path_length(g, a, b, weight="delay_s")
            assert t.path_delay(a, b) == pytest.approx(best)


def test_pinned_route_is_followed():
    spec = copy.deepcopy(GOOD)
    spec["links"].append({"a": "east", "b": "north", "rate": "10Mbit", "delay": "1ms"})
    t = from_dict(spec)
    assert t.path("east", "north") == ["east", "north"]
    spec["routes"] = {"east->north": ["east", "west", "north"]}
    t = from_dict(spec)
    assert t.path("east", "north") == ["east", "west", "north"]
    assert t.next_hop("east", "north") == "west"
    assert t.path("north", "east") == ["north", "east"]  # only that direction was pinned
    assert from_dict(yaml.safe_load(dump(t))) == t


def test_pinned_route_that_routers_would_not_follow_is_rejected():
    # a-b 1 ms, a-c 1 ms, b-c 100 ms: pin a->c via b; b's own route to c goes back via a: a loop
    spec = {"name": "loop", "dcs": ["a", "b", "c"],
            "links": [{"a": "a", "b": "b", "delay": "1ms"}, {"a": "a", "b": "c", "delay": "1ms"},
                      {"a": "b", "b": "c", "delay": "100ms"}],
            "routes": {"a->c": ["a", "b", "c"]}}
    with pytest.raises(ValidationError) as ei:
        from_dict(spec)
    assert ei.value.field == "routes['a->c']"
    spec["routes"]["b->c"] = ["b", "c"]  # the fix the error suggests
    t = from_dict(spec)
    assert t.path("a", "c") == ["a", "b", "c"]


@pytest.mark.parametrize("spec,field", [
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": {"x": 1}, "b": "b"}]}, "links[0].a"),
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": "a", "b": ["b"]}]}, "links[0].b"),
    ({"name": "x", "dcs": ["a", "b", "c"], "links": [{"a": "a", "b": "b"}, {"a": "b", "b": "c"}],
      "routes": {"a->c": ["a", ["b"], "c"]}}, "routes['a->c'][1]"),
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": "a", "b": "b"}], "ps": ["a"]}, "ps"),
    ({"name": "x", "dcs": [f"d{i}" for i in range(251)],
      "links": [{"a": f"d{i}", "b": f"d{i + 1}"} for i in range(250)]}, "dcs"),
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": "a", "b": "b", "delay": "300s"}]}, "links[0].delay"),
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": "a", "b": "b", "delay": "50s", "jitter": "11s"}]},
     "links[0].delay"),
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": "a", "b": "b", "headroom": float("inf")}]},
     "links[0].headroom"),
    ({"name": "x", "dcs": ["a", "b"], "links": [{"a": "a", "b": "b", "burst_time": float("nan")}]},
     "links[0].burst_time"),
])
def test_inputs_that_used_to_crash_are_errors_with_their_field(spec, field):
    with pytest.raises(ValidationError) as e:
        from_dict(spec)
    assert e.value.field == field, str(e.value)


@pytest.mark.parametrize("value,field", [
    ("8MiB", "dcs[1].memory"), ("2TiB", "dcs[1].memory"), ("lots", "dcs[1].memory"), (-5, "dcs[1].memory"),
    ("1Gbit", "dcs[1].memory"),
])
def test_memory_limit_out_of_range_or_unparsable_names_its_field(value, field):
    with pytest.raises(ValidationError) as e:
        from_dict({"name": "x", "dcs": ["a", {"name": "b", "memory": value}], "links": [{"a": "a", "b": "b"}]})
    assert e.value.field == field, str(e.value)


def test_memory_limit_reaches_every_host_plan_and_round_trips():
    from testbed.network.addressing import plan_network

    t = from_dict({"name": "x", "defaults": {"memory": "1GiB"},
                   "dcs": ["a", {"name": "b", "memory": "600MiB", "hosts": 2}], "links": [{"a": "a", "b": "b"}],
                   "ps": "b"})
    assert [dc.memory for dc in t.dcs] == [2**30, 600 * 2**20]
    plan = plan_network(t, with_ps=True)
    mem = {n: p.memory for n, p in plan.nodes.items()}
    assert mem["b-h1"] == mem["b-h2"] == 600 * 2**20 and mem["a-h1"] == 2**30
    assert mem["b-ps"] is None and mem["a-r"] is None  # only trainer hosts are limited
    assert from_dict(t.to_dict()) == t
