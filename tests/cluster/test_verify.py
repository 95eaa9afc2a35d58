"""``testbed net verify TOPOLOGY --cluster FILE`` across a launcher and a stand-in server, as a user runs it.

The CLI runs in its own process; what it measures on the stand-in runs there over ssh
(``net exec --until-eof``), never by entering its namespaces from here.  The checks must fail where the
network across servers is not the spec: the servers' own network slower than a tunnelled link's rate.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cluster.standins import (
    LAUNCHER_IF,
    LINE,
    PLACEMENT,
    local_namespaces,
    on_s2,
    running,
    s2_state,
    verify_failures,
    write,
)
from tests.conftest import run_cli

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    # no clock offset here: the clock shift moves a stand-in's userspace clock, not the kernel's receive stamps
    # that the one-way delay train reads, so a shifted stand-in cannot stand in for a server whose clock is off
    # (the correction's arithmetic: tests/unit/test_cluster_shaping.py)
    yield from running(tmp_path_factory.mktemp("verify"), 1)


def verify(standins, tmp_path, topo: dict, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    r = run_cli("net", "verify", str(write(tmp_path, topo, "topo.yaml")), "--cluster",
                str(write(tmp_path, standins.cluster(placement=PLACEMENT))), "--seconds", "2", "--pings", "10",
                "--json", *extra, timeout=600)
    try:
        out = json.loads(r.stdout)
    except ValueError:
        raise AssertionError(r.stdout[-2000:] + r.stderr[-3000:]) from None
    return r, out


def rows(out: dict) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["subject"]): c for c in out["checks"]}


def nothing_left(standins) -> None:
    assert local_namespaces() == []
    assert s2_state(standins) == {}
    # no command started over ssh for a measurement outlives it (net exec --until-eof ends with its channel)
    ps = on_s2(standins, "ps ax -o args").stdout
    assert "until-eof" not in ps and "iperf3" not in ps, ps


def test_verify_across_two_servers_passes_on_every_link_and_pair(standins, tmp_path):
    r, out = verify(standins, tmp_path, LINE)
    assert r.returncode == 0 and out["ok"], verify_failures(r, out)
    c = rows(out)
    for kind, subject in (("link_rtt", "a<->b"), ("link_rtt", "b<->c"), ("link_mtu", "a<->b"),
                          ("link_goodput", "a->b"), ("link_goodput", "b->a"), ("link_goodput", "b->c"),
                          ("link_goodput", "c->b"), ("pair_rtt", "a<->b"), ("pair_rtt", "a<->c"),
                          ("pair_rtt", "b<->c")):
        assert c[(kind, subject)]["status"] == "pass", c[(kind, subject)]
    # the tunnelled link is held to the same bars: 10 ms RTT, goodput >= 0.97 of 50 Mbit/s x 1448/1514
    assert 0.010 <= c[("link_rtt", "a<->b")]["measured"] <= 0.0115
    assert c[("link_goodput", "a->b")]["extra"]["ratio"] >= 0.97
    assert 0.020 <= c[("pair_rtt", "a<->c")]["measured"] <= 0.0225
    # read back on each server: its own queues (a tunnel's end on each side), its own packets
    assert c[("queue_limit", "a->b")]["extra"]["server"] == "s1" and c[("queue_limit", "a->b")]["status"] == "pass"
    assert c[("queue_limit", "b->a")]["extra"]["server"] == "s2" and c[("queue_limit", "b->a")]["status"] == "pass"
    assert {c[("queue_limit", d)]["extra"]["server"] for d in ("b->c", "c->b")} == {"s2"}
    assert c[("packets", "all nodes on s1")]["status"] == c[("packets", "all nodes on s2")]["status"] == "pass"
    assert out["servers"]["s2"]["dcs"] == ["b", "c"] and out["impairment"]["backend"] != "none"
    print("MEASURED net verify --cluster: tunnel a<->b rtt "
          f"{c[('link_rtt', 'a<->b')]['measured'] * 1e3:.2f} ms, goodput a->b x{c[('link_goodput', 'a->b')]['extra']['ratio']:.3f} "
          f"b->a x{c[('link_goodput', 'b->a')]['extra']['ratio']:.3f}; same-server b->c "
          f"x{c[('link_goodput', 'b->c')]['extra']['ratio']:.3f}")
    nothing_left(standins)


def test_verify_fails_the_tunnelled_link_when_the_servers_network_is_slower_than_the_spec(standins, tmp_path):
    """The launcher's own network port at 20 Mbit/s (tbf), under a 50 Mbit/s tunnelled link: a->b fails, the
    links that do not cross it pass.  A verify that measured each server's part alone would pass."""
    subprocess.run(["tc", "qdisc", "add", "dev", LAUNCHER_IF, "root", "tbf", "rate", "20mbit", "burst", "64k",
                    "latency", "100ms"], check=True)
    try:
        r, out = verify(standins, tmp_path, LINE)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", LAUNCHER_IF, "root"], check=False)
    assert r.returncode == 1 and not out["ok"], r.stderr[-3000:]
    c = rows(out)
    assert c[("link_goodput", "a->b")]["status"] == "fail" and c[("link_goodput", "a->b")]["extra"]["ratio"] < 0.5
    for subject in ("b->a", "b->c", "c->b"):
        assert c[("link_goodput", subject)]["status"] == "pass", c[("link_goodput", subject)]
    assert "FAIL" not in r.stdout  # --json: no table
    nothing_left(standins)


def test_a_dc_without_hosts_on_another_server_is_measured_from_a_probe_made_there(standins, tmp_path):
    """c has no hosts (and no PS host: --no-ps), on the stand-in: its temporary probe endpoint is made there
    over ssh, its goodput each way is measured from it like any DC's, and the probe is gone afterwards."""
    topo = dict(LINE, dcs=["a", "b", {"name": "c", "hosts": 0}])
    r, out = verify(standins, tmp_path, topo, "--no-ps")
    assert r.returncode == 0, r.stderr[-3000:]
    c = rows(out)
    for subject in ("b->c", "c->b"):
        row = c[("link_goodput", subject)]
        assert row["status"] == "pass", row
        print(f"MEASURED goodput {subject} (c host-less on the stand-in, its probe made there): "
              f"{row['measured'] / 1e6:.2f} Mbit/s, x{row['extra'].get('ratio', 0):.3f}")
    assert c[("link_rtt", "b<->c")]["status"] == "pass" and c[("link_goodput", "a->b")]["status"] == "pass"
    assert "not measured" not in r.stderr
    nothing_left(standins)


def test_one_way_delays_across_servers_are_read_on_corrected_clocks(standins, tmp_path):
    r, out = verify(standins, tmp_path, LINE, "--delays")
    assert r.returncode == 0 and out["ok"], verify_failures(r, out)
    c = rows(out)
    for subject in ("a->b", "b->a", "b->c", "c->b"):
        row = c[("delay_mean", subject)]
        assert row["status"] == "pass" and row["expected"] == pytest.approx(0.005), row
        # the measured offset between the two servers' clocks (here ~0) was taken out, with its bound
        assert row["extra"]["clock_correction_s"] == pytest.approx(0, abs=0.002), row["extra"]
        assert row["extra"]["clock_bound_s"] < 0.001, row["extra"]
    print(f"\nMEASURED one-way delay a->b {c[('delay_mean', 'a->b')]['measured'] * 1e3:.2f} ms, b->a "
          f"{c[('delay_mean', 'b->a')]['measured'] * 1e3:.2f} ms (spec 5; correction "
          f"{c[('delay_mean', 'a->b')]['extra']['clock_correction_s'] * 1e3:+.3f} ms)")
    nothing_left(standins)


def test_quick_runs_the_trials_self_test_across_servers(standins, tmp_path):
    r, out = verify(standins, tmp_path, LINE, "--quick")
    assert r.returncode == 0 and out["ok"], verify_failures(r, out)
    kinds = {(c["kind"], c["subject"]) for c in out["checks"]}
    assert {("link_rate", d) for d in ("a->b", "b->a", "b->c", "c->b")} <= kinds, kinds
    assert ("link_rtt", "a<->b") in kinds and ("link_goodput", "a->b") not in kinds
    nothing_left(standins)
