"""The cluster file and DC placement (testbed.cluster.model, .placement): checks name the field, automatic
placement is the best there is (compared with every assignment), and the CLI refuses bad input with exit 2."""

from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction

import pytest
import yaml

from testbed.cluster.model import from_dict
from testbed.cluster.placement import dc_nodes, place
from tests.conftest import run_cli
from topologies.loader import load
from topologies.model import from_dict as topology
from traffic_control.errors import ValidationError


def servers(n: int, **extra: object) -> list[dict[str, object]]:
    return [{"name": f"s{i}", "address": f"10.0.0.{i}", **extra} for i in range(1, n + 1)]


@pytest.mark.parametrize("spec, field, words", [
    ({}, "servers", "missing"),
    ({"servers": []}, "servers", ""),
    ({"servers": [{"name": "S1", "address": "10.0.0.1"}]}, "servers[0].name", ""),
    ({"servers": [{"name": "s1", "address": "10.0.0.1; rm -rf /"}]}, "servers[0].address", ""),
    ({"servers": [{"name": "s1", "address": "a"}, {"name": "s1", "address": "b"}]}, "servers[1].name", "duplicate"),
    ({"servers": [{"name": "s1", "address": "a"}, {"name": "s2", "address": "a"}]}, "servers[1].address",
     "also server"),
    ({"servers": servers(2), "launcher": "s9"}, "launcher", "no server named 's9'"),
    ({"servers": servers(2), "placement": {"east": "s9"}}, "placement.east", "no server named 's9'"),
    ({"servers": servers(2), "placement": "balanced"}, "placement", ""),
    ({"servers": servers(2), "mode": "tunnel"}, "mode", ""),
    ({"servers": [{"name": "s1", "address": "a", "identity": "/nonexistent/key"}]}, "servers[0].identity",
     "no key file"),
    ({"servers": [{"name": "s1", "address": "a", "port": 0}]}, "servers[0].port", ""),
    ({"servers": servers(1), "colour": "red"}, "colour", ""),
])
def test_bad_cluster_files_name_the_field(spec, field, words):
    with pytest.raises(ValidationError) as e:
        from_dict(spec)
    assert e.value.field == field, str(e.value)
    assert words in str(e.value)
    assert e.value.fix or "fix" in str(e.value)


def test_defaults_and_launcher():
    c = from_dict({"servers": servers(2)})
    assert c.mode == "emulate" and c.launcher == "s1" and c.placement is None
    assert c.server("s2").user == "root" and c.server("s2").port == 22 and c.server("s2").target == "root@10.0.0.2"


def test_given_placement_is_checked_against_the_topology():
    topo = load("three_dc_triangle")
    with pytest.raises(ValidationError, match="west .*have no server") as e:
        place(topo, from_dict({"servers": servers(2), "placement": {"east": "s1", "central": "s2"}}))
    assert e.value.field == "placement"
    with pytest.raises(ValidationError) as e:
        place(topo, from_dict({"servers": servers(2), "placement": {"east": "s1", "central": "s2", "west": "s2",
                                                                     "mars": "s1"}}))
    assert e.value.field == "placement.mars"
    tight = servers(2)
    tight[1]["max_hosts"] = 5
    with pytest.raises(ValidationError, match="would hold 6 emulated nodes") as e:
        place(topo, from_dict({"servers": tight, "placement": {"east": "s1", "central": "s2", "west": "s2"}}))
    p = place(topo, from_dict({"servers": servers(2), "placement": {"east": "s1", "central": "s2", "west": "s1"}}))
    assert not p.automatic and p.assignment == {"east": "s1", "central": "s2", "west": "s1"}
    assert set(p.cut) == {("east", "central"), ("central", "west")}


def test_gpus_must_fit_unless_shared():
    topo = topology({"dcs": [{"name": "a", "hosts": 2, "gpus": 2}, {"name": "b", "hosts": 2, "gpus": 2}],
                     "links": [{"a": "a", "b": "b", "rate": "1Gbit", "delay": "5ms"}]})
    small = servers(2, gpus=3)
    with pytest.raises(ValidationError, match="does not fit"):
        place(topo, from_dict({"servers": small}))
    ok = place(topo, from_dict({"servers": servers(2, gpus=4)}))
    assert ok.gpus == {"s1": 4, "s2": 4}
    with pytest.raises(ValidationError, match="has 4 GPUs; its DCs ask for 8"):
        place(topo, from_dict({"servers": servers(2, gpus=4), "placement": {"a": "s1", "b": "s1"}}))


def test_auto_placement_that_cannot_fit_says_why():
    topo = load("geo_wan")
    with pytest.raises(ValidationError, match="does not fit") as e:
        place(topo, from_dict({"servers": servers(2, max_hosts=3)}))
    assert e.value.field == "placement" and "max_hosts" in e.value.fix


def _brute(topo, cluster):
    nodes = dc_nodes(topo)
    best = None
    for combo in itertools.product(cluster.names, repeat=len(topo.dcs)):
        a = dict(zip(topo.dc_names, combo))
        loads = {s: 0 for s in cluster.names}
        for dc, s in a.items():
            loads[s] += nodes[dc]
        if any(sv.max_hosts is not None and loads[sv.name] > sv.max_hosts for sv in cluster.servers):
            continue
        cut = [lk for lk in topo.links if a[lk.a] != a[lk.b]]
        cores = {sv.name: sv.cpus or 1 for sv in cluster.servers}
        cost = (max(Fraction(loads[n], cores[n]) for n in loads), len(cut),
                sum(lk.forward.rate_bps + lk.reverse.rate_bps for lk in cut))
        best = cost if best is None or cost < best else best
    return best


def test_auto_placement_is_optimal_on_random_graphs():
    """Balance first, then fewest tunnels, then least tunnelled bandwidth: the search's answer costs what
    the best of every assignment costs (80 random connected topologies, 2-4 servers, some with max_hosts)."""
    rng = random.Random(19)
    for trial in range(80):
        n = rng.randint(2, 6)
        dcs = [{"name": f"d{i}", "hosts": rng.randint(0, 4)} for i in range(n)]
        edges = {(i, i + 1) for i in range(n - 1)} | {tuple(sorted(rng.sample(range(n), 2))) for _ in range(n)}
        links = [{"a": f"d{a}", "b": f"d{b}", "rate": f"{rng.choice([10, 50, 200, 1000])}Mbit", "delay": "5ms"}
                 for a, b in sorted(edges)]
        topo = topology({"name": f"r{trial}", "dcs": dcs, "links": links, "ps": "d0" if trial % 2 else None})
        k = rng.randint(2, 4)
        cap = rng.choice([None, None, max(dc_nodes(topo).values()) + rng.randint(0, 3)])
        cluster = from_dict({"servers": servers(k, **({} if cap is None else {"max_hosts": cap}))})
        if trial % 3 == 0:  # every server's cores known: the balance is in nodes per core
            cluster = cluster.with_cpus({name: rng.choice([1, 2, 4, 8]) for name in cluster.names})
        expected = _brute(topo, cluster)
        if expected is None:
            with pytest.raises(ValidationError):
                place(topo, cluster)
            continue
        p = place(topo, cluster)
        cores = {sv.name: sv.cpus or 1 for sv in cluster.servers}
        got = (max(Fraction(p.loads[n], cores[n]) for n in p.loads), len(p.cut), p.cut_rate_bps)
        assert p.optimal and got == expected, (trial, p.assignment, got, expected)
        assert sum(p.loads.values()) == sum(dc_nodes(topo).values())


def test_a_server_with_more_cores_carries_more_nodes_and_unknown_cores_compare_nodes():
    """geo_wan's DCs on a 12-core and a 4-core server: the 12-core one carries about three times the nodes;
    with one server's cores unknown, loads are compared in nodes as before."""
    topo = load("geo_wan")
    both = from_dict({"servers": [{"name": "big", "address": "10.0.0.1", "cpus": 12},
                                  {"name": "small", "address": "10.0.0.2", "cpus": 4}]})
    p = place(topo, both)
    assert p.cpus == {"big": 12, "small": 4} and p.loads["big"] > 2 * p.loads["small"], p.loads
    assert p.to_dict()["nodes_per_core"]["big"] == pytest.approx(p.loads["big"] / 12)
    even = place(topo, from_dict({"servers": [{"name": "big", "address": "10.0.0.1", "cpus": 12},
                                              {"name": "small", "address": "10.0.0.2"}]}))
    assert even.cpus == {} and abs(even.loads["big"] - even.loads["small"]) <= max(dc_nodes(topo).values())
    measured = place(topo, from_dict({"servers": servers(2)}).with_cpus({"s1": 12, "s2": 4}))
    assert measured.loads["s1"] > 2 * measured.loads["s2"]


def test_other_jobs_load_weighs_like_fewer_cores():
    """Two 12-core servers, one with 8 cores' worth of someone else's job: placed like 12 and 4 free cores;
    a server kept fully busy counts for a tenth of a core and takes nothing while the rest has room."""
    topo = load("geo_wan")
    idle = place(topo, from_dict({"servers": servers(2)}).with_cpus({"s1": 12, "s2": 12}, {"s1": 0.1, "s2": 0.0}))
    assert abs(idle.loads["s1"] - idle.loads["s2"]) <= max(dc_nodes(topo).values())
    busy = place(topo, from_dict({"servers": servers(2)}).with_cpus({"s1": 12, "s2": 12}, {"s2": 8.0}))
    assert busy.cpus == {"s1": 12, "s2": 12} and busy.free == {"s1": 12.0, "s2": 4.0}, busy
    assert busy.loads["s1"] > 2 * busy.loads["s2"], busy.loads
    assert busy.to_dict()["nodes_per_core"]["s2"] == pytest.approx(busy.loads["s2"] / 4, abs=1e-3)
    full = place(topo, from_dict({"servers": servers(3)}).with_cpus({"s1": 4, "s2": 4, "s3": 4},
                                                                   {"s1": 0.2, "s2": 4.0, "s3": 0.3}))
    assert full.free["s2"] == 0.1 and full.loads["s2"] == 0, full.loads


def test_the_cpu_probe_counts_only_the_allowed_cores():
    from testbed.cluster.capacity import cpu_list, parse, probe_here

    assert cpu_list("0-3,6") == {0, 1, 2, 3, 6} and cpu_list("5") == {5}
    text = ("Cpus_allowed_list:\t1-2\n"
            "cpu0 100 0 100 800 0 0 0 0 0 0\ncpu1 100 0 0 900 0 0 0 0 0 0\ncpu2 0 0 0 1000 0 0 0 0 0 0\n--\n"
            # cpu0 busy throughout (not allowed: not counted); cpu1 fully busy; cpu2 a quarter busy, a quarter iowait
            "cpu0 200 0 200 800 0 0 0 0 0 0\ncpu1 200 0 0 900 0 0 0 0 0 0\ncpu2 10 0 15 1050 25 0 0 0 0 0\n")
    load = parse(text)
    assert load.cores == 2 and load.busy == pytest.approx(1.25)
    with pytest.raises(ValueError):
        parse("bash: grep: not found")
    here = probe_here(window_s=0.2)  # the real probe on this machine: every allowed core, a sane share busy
    import os

    assert here.cores == len(os.sched_getaffinity(0)) and 0 <= here.busy <= here.cores + 0.05, here


def test_cli_place_prints_and_refuses(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text(yaml.safe_dump({"servers": servers(2)}))
    r = run_cli("cluster", "place", "three_dc_triangle", "--cluster", str(f), "--json", check=True)
    out = json.loads(r.stdout)
    assert out["automatic"] and out["optimal"] and sorted(out["loads"].values()) == [4, 6]
    r = run_cli("cluster", "place", "three_dc_triangle", "--cluster", str(f), check=True)
    assert "tunnels" in r.stdout and "(launcher)" in r.stdout
    f.write_text(yaml.safe_dump({"servers": servers(2), "placement": {"east": "s3"}}))
    r = run_cli("cluster", "place", "three_dc_triangle", "--cluster", str(f))
    assert r.returncode == 2 and "placement.east" in r.stderr and "s3" in r.stderr, r.stderr
    r = run_cli("cluster", "place", "three_dc_triangle", "--cluster", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no cluster file" in r.stderr
    r = run_cli("cluster", "check", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no cluster file" in r.stderr
